"""The processes one run starts: servers, Celery workers, and a probe of the CPU others use meanwhile.

Process handling itself (own process group, log file, stop by pid) is `mcp_celery.testing.processes.Process`,
shared with the tests and the demo; this module adds what only the bench needs: every process is
started from the repository root with it on PYTHONPATH and its log under bench/.logs/, and its
session id is remembered so that `CpuProbe` can tell the bench's CPU from everybody else's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from mcp_celery.testing.processes import Process, free_port

ROOT = Path(__file__).resolve().parent.parent  # the repository root
BENCH = ROOT / "bench"
LOGS = BENCH / ".logs"
PY = sys.executable

MY_SESSIONS: set[int] = set()  # session ids of the processes we started (start_new_session: sid == pid)


class CpuProbe:
    """CPU used on the machine by processes that are not ours (other users of the shared cores)."""

    hz = os.sysconf("SC_CLK_TCK")
    ncpu = os.cpu_count() or 1

    @staticmethod
    def sample() -> tuple[float, int, int]:
        """(monotonic time, busy ticks of the whole machine, ticks used by the bench and its sessions)."""
        with open("/proc/stat") as fh:
            parts = fh.readline().split()[1:]
        v = [int(x) for x in parts]
        busy = v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)  # user nice system irq softirq steal
        me, mine = os.getpid(), 0
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as fh:
                    st = fh.read()
            except OSError:
                continue
            f = st[st.rindex(")") + 2 :].split()
            if int(d) == me or int(f[3]) in MY_SESSIONS:
                mine += int(f[11]) + int(f[12])
        return time.monotonic(), busy, mine

    @classmethod
    def foreign(cls, a: tuple[float, int, int], b: tuple[float, int, int]) -> float:
        """Share of the machine's CPU capacity used by other processes between samples a and b."""
        wall = (b[0] - a[0]) * cls.hz * cls.ncpu
        return max(0.0, ((b[1] - a[1]) - (b[2] - a[2])) / wall) if wall > 0 else 0.0


def start(name: str, argv: list[str], env: dict[str, str] | None = None) -> Process:
    """Start `argv` from the repository root, logging to bench/.logs/NAME.log; the caller stops it."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env["PYTHONUNBUFFERED"] = "1"
    full_env.update(env or {})
    proc = Process(argv, full_env, LOGS / f"{name}.log", cwd=ROOT)
    MY_SESSIONS.add(proc.pid)
    return proc


def http_answers(url: str) -> bool:
    """Whether anything answers an HTTP POST at `url` (any status: the server is up)."""
    try:
        httpx.post(url, content=b"{}", headers={"Content-Type": "application/json"}, timeout=1)
    except httpx.HTTPError:
        return False
    return True


def start_http_server(name: str, argv: list[str], url: str, env: dict[str, str] | None = None) -> Process:
    """Start a server and wait until it answers at `url` (fails with its log if it exits first)."""
    proc = start(name, argv, env)
    try:
        proc.wait_ready(lambda: http_answers(url), 60, name)
    except RuntimeError:
        proc.stop()
        raise
    return proc


def start_ours_server(redis_url: str, name: str, env: dict[str, str] | None = None) -> tuple[Process, str]:
    """`mcp-celery serve -A bench.bench_jobs --http` on a spare loopback port over the Redis at redis_url.

    Returns the process and its MCP endpoint's URL, once it answers.
    """
    mcpc = shutil.which("mcp-celery")
    argv = [mcpc] if mcpc else [PY, "-m", "mcp_celery"]
    port = free_port()
    argv += ["serve", "-A", "bench.bench_jobs", "--http", "--host", "127.0.0.1", "--port", str(port)]
    url = f"http://127.0.0.1:{port}/mcp"
    return start_http_server(name, argv, url, env={"BENCH_REDIS_URL": redis_url, **(env or {})}), url


def start_worker(redis_url: str, name: str, concurrency: int = 2, env: dict[str, str] | None = None) -> Process:
    """A prefork Celery worker for bench.bench_jobs over the Redis at redis_url (not waited for)."""
    celery = shutil.which("celery") or "celery"
    argv = [celery, "-A", "bench.bench_jobs", "worker", "-P", "prefork", "-c", str(concurrency)]
    argv += ["--without-gossip", "--without-mingle", "-l", "WARNING", "-n", f"{name}@%h"]
    return start(name, argv, env={"BENCH_REDIS_URL": redis_url, **(env or {})})


@contextmanager
def paused(proc: Process) -> Iterator[None]:
    """`proc`'s whole process group stopped (SIGSTOP) for the block, then continued."""
    os.killpg(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(proc.pid, signal.SIGCONT)


def wait_worker(app: Any, proc: Process, deadline_s: float = 30) -> None:
    """Wait until a worker of `app` answers a control ping; fail with the log if `proc` exits first."""

    def pong() -> bool:
        try:
            return bool(app.control.ping(timeout=0.5))
        except Exception:  # noqa: BLE001  (broker not ready yet: any error means "not yet")
            return False

    proc.wait_ready(pong, deadline_s, "the Celery worker")


@contextmanager
def worker_on_private_redis(tag: str) -> Iterator[tuple[str, list[Process]]]:
    """A private Redis (BENCH_REDIS_URL names it from here on) and a prefork worker on it, answering.

    Yields the Redis URL and the list of processes started: add the servers the caller starts to
    it, and every one is stopped at the end, the last started first, then the Redis.
    """
    from bench.redis_tools import BenchRedis  # imported here: redis_tools imports this module

    rds = BenchRedis()
    rds.start()
    os.environ["BENCH_REDIS_URL"] = rds.url
    procs: list[Process] = []
    try:
        from bench import bench_jobs  # imported late: it reads BENCH_REDIS_URL

        worker = start_worker(rds.url, f"worker-{tag}")
        procs.append(worker)
        wait_worker(bench_jobs.app, worker)
        yield rds.url, procs
    finally:
        for proc in reversed(procs):
            proc.stop()
        rds.stop()


def write_report(tag: str, text: str) -> None:
    """Print a side tool's table and keep it as bench/.logs/TAG.md."""
    (LOGS / f"{tag}.md").write_text(text + "\n")
    print(text)


def report_main(module: str, doc: str, out: Path, measure: Callable[[bool], str]) -> None:
    """The command line of a side tool that writes one results page: `python -m MODULE [--quick] [--out FILE]`.

    `measure(quick)` runs it and returns the page; a `--quick` run (a smoke test, not figures) writes nothing.
    """
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller run (a smoke test, not figures)")
    parser.add_argument("--out", type=Path, default=out)
    args = parser.parse_args()
    text = measure(args.quick)
    print(text)
    if not args.quick:
        args.out.write_text(text)
