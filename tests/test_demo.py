"""README command 1: `mcp-celery demo` on a machine with no Redis configured or answering."""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT, free_port, session_redis


@pytest.mark.venv
def test_the_demo_starts_an_embedded_redis_and_walks_through_every_feature() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERY_")}
    env["MCP_CELERY_DEMO_REDIS"] = f"redis://127.0.0.1:{free_port()}"  # nothing listens there
    out = subprocess.run(
        [sys.executable, "-m", "mcp_celery", "demo", "--port", str(free_port())],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "started an embedded one" in out.stdout
    expected = ("result: demo done after 2 s", "'published': True", "cancelled by client", "result: 6 words")
    plain = ("as a plain result: job done after 1 s", "nothing was cancelled", "result: job done after 5 s")
    for line in (*expected, *plain):
        assert line in out.stdout, out.stdout
    # Step 1 is pushed, not polled: each of its changes came as a notifications/tasks, the last one the end.
    step_one = out.stdout.split("\n1. ", 1)[1].split("\n2. ", 1)[0].splitlines()[1:]
    changes = [line for line in step_one if not line.lstrip().startswith(("tools/call ->", "result:")) and line]
    assert changes and all(line.endswith("(notifications/tasks)") for line in changes), step_one
    assert changes[-1].split() == ["completed", "(notifications/tasks)"], step_one


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
    env.update(CELERY_BROKER_URL=session_redis(8), CELERY_RESULT_BACKEND=session_redis(9))
    out = subprocess.run(
        [venv / "bin" / "mcp-celery", "demo", "--port", str(free_port())],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "result: demo done after 2 s" in out.stdout and "(notifications/tasks)" in out.stdout, out.stdout
