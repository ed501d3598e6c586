"""README command 1: `mcp-celery demo`, on a private Redis of its own unless one is named."""

from __future__ import annotations

import os
import re
import signal
import site
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from mcp_celery.testing.processes import Process, redis_answers, start_redis, wait_for
from tests.support.harness import ROOT, HttpClient, free_port


@pytest.fixture
def throwaway_redis(tmp_path: Path) -> Iterator[str]:
    """A redis-server of the test's own, holding one key of 'the user's work'."""
    url, proc = start_redis(tmp_path / "throwaway-redis.log")
    redis.Redis.from_url(f"{url}/0").set("my-own-work", "keep me")
    yield url
    proc.stop()


def key_counts(client: redis.Redis) -> dict[str, int]:
    return {db: int(info["keys"]) for db, info in client.info("keyspace").items()}


@pytest.mark.venv
def test_the_demo_runs_on_a_private_redis_and_leaves_a_redis_it_could_have_found_untouched(
    throwaway_redis: str,
) -> None:
    # Every way the demo once found a Redis points at this one: the environment a Celery project exports.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CELERY_", "MCP_CELERY_DEMO"))}
    env.update(
        CELERY_BROKER_URL=f"{throwaway_redis}/0",
        CELERY_RESULT_BACKEND=f"{throwaway_redis}/1",
        MCP_CELERY_REDIS_URL=f"{throwaway_redis}/2",
    )
    watching = redis.Redis.from_url(throwaway_redis)  # one connection, held: any other one is counted
    keys_before = key_counts(watching)
    connections_before = int(watching.info("stats")["total_connections_received"])
    out = subprocess.run(
        [sys.executable, "-m", "mcp_celery", "demo", "--port", str(free_port())],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert key_counts(watching) == keys_before == {"db0": 1}
    assert int(watching.info("stats")["total_connections_received"]) == connections_before  # not even a PING
    said = re.search(r"Redis: a private redis-server \(pid (\d+), .*\) on (redis://\S+);", out.stdout)
    assert said is not None and said[2] != throwaway_redis, out.stdout
    assert "ignoring CELERY_BROKER_URL, CELERY_RESULT_BACKEND, MCP_CELERY_REDIS_URL" in out.stdout
    expected = ("result: demo done after 2 s", "'published': True", "cancelled by client", "result: 6 words")
    released = ("input_required  waiting for approval: Publish mcp-celery 1.0.0?", "approved by bob: digest checked")
    plain = ("as a plain result: job done after 1 s", "nothing was cancelled", "result: job done after 5 s")
    for line in (*expected, *plain, *released):
        assert line in out.stdout, out.stdout
    # Step 1 is pushed, not polled: each of its changes came as a notifications/tasks, the last one the end.
    step_one = out.stdout.split("\n1. ", 1)[1].split("\n2. ", 1)[0].splitlines()[1:]
    changes = [line for line in step_one if not line.lstrip().startswith(("tools/call ->", "result:")) and line]
    assert changes and all(line.endswith("(notifications/tasks)") for line in changes), step_one
    assert changes[-1].split() == ["completed", "(notifications/tasks)"], step_one
    # It cleaned up: its Redis stopped (by pid), its folder of logs and files gone.
    assert not redis_answers(said[2])
    with pytest.raises(ProcessLookupError):
        os.kill(int(said[1]), 0)
    logs = re.search(r"log: (\S+)/worker\.log", out.stdout)
    assert logs is not None and not Path(logs[1]).exists(), out.stdout


def test_a_shared_redis_named_by_mcp_celery_demo_redis_must_answer() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERY_")}
    env["MCP_CELERY_DEMO_REDIS"] = f"redis://:secret@127.0.0.1:{free_port()}"  # nothing listens there
    out = subprocess.run(
        [sys.executable, "-m", "mcp_celery", "demo"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "MCP_CELERY_DEMO_REDIS=redis://:***@127.0.0.1:" in out.stderr and "secret" not in out.stderr, out.stderr


def venv_seeing_this_interpreters_packages(venv: Path) -> Path:
    """A fresh virtualenv whose interpreter also finds this interpreter's installed packages (the
    dependencies), whether this one is the system's or a virtualenv's; returns its python.

    Not `--system-site-packages`: from inside a virtualenv that reaches the base interpreter's
    packages, not this virtualenv's. Later entries on the path, so the virtualenv's own come first.
    """
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    ours = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    lines = "; ".join(f"site.addsitedir({folder!r})" for folder in ours if Path(folder).is_dir())
    Path(purelib, "zz_parent_site_packages.pth").write_text(f"import site; {lines}\n")
    return python


@pytest.mark.venv
def test_the_demo_runs_from_a_plain_install_outside_the_checkout(tmp_path: Path) -> None:
    """A wheel of the package, installed into a fresh virtualenv, runs the demo from another folder."""
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(wheels), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    venv = tmp_path / "venv"
    python = venv_seeing_this_interpreters_packages(venv)
    wheel = next(wheels.glob("mcp_celery-*.whl"))
    subprocess.run([python, "-m", "pip", "install", "--no-deps", "--quiet", str(wheel)], check=True, timeout=300)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CELERY_", "PYTHONPATH"))}
    where = subprocess.run(
        [python, "-c", "import mcp_celery; print(mcp_celery.__file__)"],
        cwd=elsewhere, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert where.stdout.startswith(str(venv)), where.stdout  # not the checkout
    # A shared Redis, named: the demo uses its databases 0 and 1 and says so.
    shared, redis_proc = start_redis(tmp_path / "shared-redis.log")
    try:
        env["MCP_CELERY_DEMO_REDIS"] = shared
        out = subprocess.run(
            [venv / "bin" / "mcp-celery", "demo", "--port", str(free_port())],
            cwd=elsewhere, env=env, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
        assert "result: demo done after 2 s" in out.stdout and "(notifications/tasks)" in out.stdout, out.stdout
        assert f"Redis: {shared} (MCP_CELERY_DEMO_REDIS), databases 0 and 1" in out.stdout, out.stdout
        assert set(key_counts(redis.Redis.from_url(shared))) >= {"db0", "db1"}
    finally:
        redis_proc.stop()


def children_of(pid: int) -> list[int]:
    """The pids whose parent is `pid`, read from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # it ended meanwhile
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def descendants_of(pid: int) -> list[int]:
    """Every process below `pid`: its children, theirs (a prefork worker's pool), and so on."""
    found, level = [], children_of(pid)
    while level:
        found += level
        level = [grandchild for child in level for grandchild in children_of(child)]
    return found


def running(pid: int) -> bool:
    """Whether `pid` is a process that has not exited (a zombie, exited but not reaped yet, has)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def with_pool(tree: list[int]) -> list[int] | None:
    """The demo's processes once its worker's three pool processes are among them (else None)."""
    return tree if len(tree) >= 6 else None


def command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
    except OSError:
        return "?"


def test_the_demo_serving_on_takes_the_token_it_prints_and_a_sigterm_stops_all_it_started(tmp_path: Path) -> None:
    """All it started: its Redis, the worker and the server, and the worker's prefork pool below it, one
    of whose processes runs a job at the time."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CELERY_", "MCP_CELERY_DEMO", "MCP_CELERY_TOKEN"))}
    url = f"http://127.0.0.1:{free_port()}/mcp"
    demo = Process(
        [sys.executable, "-m", "mcp_celery", "demo", "--port", url.split(":")[2].split("/")[0], "--serve"],
        env, tmp_path / "demo.out", cwd=ROOT,
    )  # fmt: skip
    tree: list[int] = []
    try:
        demo.wait_ready(lambda: "until Ctrl-C" in demo.output(), 240, "the demo to serve on")
        started = children_of(demo.pid)
        assert len(started) == 3, (started, demo.output())  # its Redis, the worker and the server
        # And below the worker its pool, `-c 3` processes, which the demo must stop too.
        tree = wait_for(lambda: with_pool(descendants_of(demo.pid)), 60, 0.1, "the worker's pool processes")
        token = re.search(r"export MCP_CELERY_TOKEN=(\S+)", demo.output())
        assert token is not None, demo.output()
        call = [sys.executable, "-m", "mcp_celery", "call", "slow_compute", "--args", '{"seconds": 1}', "--url", url]
        refused = subprocess.run(call, env=env, capture_output=True, text=True, timeout=60)
        assert refused.returncode != 0 and "needs a token" in refused.stderr, refused.stdout + refused.stderr
        called = subprocess.run(
            call, env={**env, "MCP_CELERY_TOKEN": token[1]}, capture_output=True, text=True, timeout=60
        )
        assert called.returncode == 0 and "job done after 1 s" in called.stdout, called.stdout + called.stderr
        # A job runs in a pool process when the demo is told to stop, as when a user presses Ctrl-C mid-job.
        busy = HttpClient(url, token[1])
        running_job = busy.start("slow_compute", {"seconds": 600})
        wait_for(lambda: busy.get(running_job).get("statusMessage", "").startswith("step"), 60, 0.1, "the job to run")
        busy.close()
        tree = list(dict.fromkeys([*tree, *descendants_of(demo.pid)]))  # a pool process replaced meanwhile too
        demo.proc.send_signal(signal.SIGTERM)  # the demo alone, as `kill PID` sends it
        assert demo.proc.wait(timeout=60) == 0, demo.output()
        left = [pid for pid in tree if running(pid)]
        assert not left, [(pid, command_of(pid)) for pid in left]  # checked before anything below kills them
        logs = re.search(r"log: (\S+)/worker\.log", demo.output())
        assert logs is not None and not Path(logs[1]).exists(), demo.output()
    finally:
        demo.stop()
        for pid in tree:  # left over only when the test failed above, and reported there: by pid, no group
            if running(pid):
                os.kill(pid, signal.SIGKILL)
