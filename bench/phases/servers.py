"""The ours and fastmcp phases: start a task server (and for ours its Celery worker), then measure it.

ours: `mcp-celery serve -A bench.bench_jobs --http` with a prefork worker, plus the stored-task scaling.
fastmcp: FastMCP 4.1.4 + fastmcp-tasks 4.1.4 (`bench/fastmcp_server.py`) from bench/.venv-fastmcp, which
is created on the first run: its packages exclude this project's redis-py.
"""

from __future__ import annotations

import functools
import subprocess
import sys

from bench.config import RunConfig, say
from bench.phases.scaling import fill_and_measure
from bench.phases.task_server import Target, measure_task_server
from bench.procs import BENCH, paused, start_http_server, start_ours_server, start_worker, wait_worker
from bench.redis_tools import BenchRedis
from bench.results import Results
from mcp_celery.testing.processes import free_port

FASTMCP_PY = BENCH / ".venv-fastmcp" / "bin" / "python"
FASTMCP_PINS = ("fastmcp==4.1.4", "fastmcp-tasks==4.1.4")


async def run_ours(cfg: RunConfig, rds: BenchRedis, results: Results) -> None:
    from bench import bench_jobs  # imported late: it reads BENCH_REDIS_URL, which the entry point sets

    worker = start_worker(rds.url, "worker-ours")
    server = None
    try:
        server, url = start_ours_server(rds.url, "ours-server")
        wait_worker(bench_jobs.app, worker)
        target = Target("ours", url, rds, results.ours, results, cfg, paused_jobs=functools.partial(paused, worker))
        await measure_task_server(target, fill_and_measure)
    finally:
        if server is not None:
            server.stop()
        worker.stop(timeout=15)
        if server is not None and server.proc.returncode not in (0, -15, None):
            results.notes.append(f"ours server exit code {server.proc.returncode}; log tail: {server.tail(10)}")


def ensure_fastmcp_venv(results: Results) -> bool:
    """Create bench/.venv-fastmcp with the pinned FastMCP packages if it is not there yet."""
    if FASTMCP_PY.exists():
        return True
    say(f"  creating bench/.venv-fastmcp ({', '.join(FASTMCP_PINS)}; they exclude our redis-py)")
    venv = FASTMCP_PY.parent.parent
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, *FASTMCP_PINS], check=True, timeout=900)
    except (subprocess.SubprocessError, OSError) as exc:
        results.notes.append(f"fastmcp: could not create bench/.venv-fastmcp ({exc}); phase skipped")
        return False
    return FASTMCP_PY.exists()


async def run_fastmcp(cfg: RunConfig, rds: BenchRedis, results: Results) -> None:
    if not ensure_fastmcp_venv(results):
        say("  fastmcp venv missing, skipped")
        return
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    argv = [str(FASTMCP_PY), str(BENCH / "fastmcp_server.py"), str(port), f"{rds.url}/0"]
    server = start_http_server("fastmcp-server", argv, url)
    try:
        await measure_task_server(Target("fastmcp", url, rds, results.fastmcp, results, cfg))
    finally:
        server.stop()
