"""Profile the mcp-celery server under one kind of load with py-spy.

python -m bench.profile {create,get,sync,e2e,listen,batch} [--seconds S] [--concurrency C]
    [--target server|worker|celery-floor]

Starts a private Redis, a prefork worker and `mcp-celery serve`, runs the load while `py-spy record`
samples the server process (and its threads), then prints the top functions by inclusive and by self time,
then mcp-celery's own functions by inclusive time (from py-spy's collapsed-stack output), and writes
bench/.logs/profile-<what>-<target>.txt (collapsed stacks, feed it to any flame graph tool) and
profile-<what>-<target>-summary.txt. `--target worker` samples the worker and its pool instead;
`--target celery-floor` serves the same load from `bench.celery_floor_server` (tool `raw_noop`) and samples
that server, to set ours beside the least a server in front of Celery pays.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench import load, rpc
from bench.procs import LOGS, PY, start_http_server, start_ours_server, start_worker, wait_worker
from bench.redis_tools import BenchRedis
from bench.task_ops import create_many, e2e_op, get_op
from mcp_celery.testing.processes import free_port


def summarize(collapsed: Path, top: int = 40) -> str:
    incl: collections.Counter[str] = collections.Counter()
    self_: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        k = int(n)
        frames = stack.split(";")
        total += k
        seen = set()
        for fr in frames:
            if fr not in seen:
                incl[fr] += k
                seen.add(fr)
        self_[frames[-1]] += k
    out = [f"samples: {total}", "", "inclusive:"]
    out += [f"{v / total:6.1%}  {k}" for k, v in incl.most_common(top)]
    out += ["", "self:"]
    out += [f"{v / total:6.1%}  {k}" for k, v in self_.most_common(top)]
    # What mcp-celery adds, where it is only a small part of the process (the worker under Celery's code).
    own = [(k, v) for k, v in incl.most_common() if " (mcp_celery/" in k]
    out += ["", "mcp-celery's own functions, inclusive:"]
    out += [f"{v / total:6.1%}  {k}" for k, v in own[:top]]
    return "\n".join(out)


async def drive(what: str, url: str, seconds: float, conc: int, tool: str = "noop") -> load.LoadResult:
    op: load.Op
    if what == "create":
        op = lambda c, i: rpc.call_tool(c, url, tool, {"x": i})  # noqa: E731
    elif what == "sync":
        op = lambda c, i: rpc.call_tool(c, url, tool, {"x": i}, declare=False)  # noqa: E731
    elif what == "get":
        ids = await create_many(url, 500, 4)
        await asyncio.sleep(2)  # let the worker finish them: tasks/get then reads finished tasks
        op = get_op(url, ids)
    elif what == "listen":
        from bench.push import push_op  # create, then subscriptions/listen until the task ends

        op = push_op(url)
    elif what == "batch":
        from bench.push import batch_push_op  # create 16, then one subscriptions/listen over them all

        op = batch_push_op(url, tool)
    else:
        op = e2e_op(url, tool)
    return await load.run_load(op, conc, duration=seconds, warmup=1.0, deadline=seconds + 120)


def start_py_spy(
    pyspy: str, pid: int, rate: int, out: Path, seconds: float, *, children: bool = False
) -> subprocess.Popen[bytes]:
    """py-spy sampling `pid` (and its threads; with `children`, its pool processes too) into `out`,
    collapsed raw stacks, for `seconds`."""
    argv = [pyspy, "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw", "--output", str(out)]
    argv += ["--duration", str(int(seconds)), "--nonblocking", *(["--subprocesses"] if children else [])]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.profile")
    ap.add_argument("what", choices=["create", "get", "sync", "e2e", "listen", "batch"])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples/s")
    ap.add_argument(
        "--target",
        choices=["server", "worker", "celery-floor"],
        default="server",
        help="the process to profile (worker: its pool too; celery-floor: bench.celery_floor_server instead of ours)",
    )
    a = ap.parse_args()
    if a.target == "celery-floor" and a.what in ("get", "listen"):
        ap.error(f"{a.what} runs on mcp-celery only")
    pyspy = shutil.which("py-spy")
    if not pyspy:
        sys.exit("py-spy not installed: pip install py-spy")
    rds = BenchRedis()
    rds.start()
    os.environ["BENCH_REDIS_URL"] = rds.url
    from bench import bench_jobs  # imported late: it reads BENCH_REDIS_URL

    w = start_worker(rds.url, "worker-prof")
    s = None
    out = LOGS / f"profile-{a.what}-{a.target}.txt"
    spy = None
    try:
        if a.target == "celery-floor":
            port = free_port()
            url = f"http://127.0.0.1:{port}/mcp"
            s = start_http_server("celery-floor-prof", [PY, "-m", "bench.celery_floor_server", str(port)], url)
        else:
            s, url = start_ours_server(rds.url, "ours-prof")
        wait_worker(bench_jobs.app, w)
        profiled = w.pid if a.target == "worker" else s.pid
        spy = start_py_spy(pyspy, profiled, a.rate, out, a.seconds + 3, children=a.target == "worker")
        time.sleep(0.5)
        tool = "raw_noop" if a.target == "celery-floor" else "noop"
        res = asyncio.run(drive(a.what, url, a.seconds, a.concurrency, tool))
        print(f"{a.what}: {res.summary()}")
        spy.wait(timeout=60)
        summary = summarize(out)
        (LOGS / f"profile-{a.what}-{a.target}-summary.txt").write_text(summary)
        print(summary)
    finally:
        if spy is not None and spy.poll() is None:
            spy.terminate()
        if s is not None:
            s.stop()
        w.stop()
        rds.stop()


if __name__ == "__main__":
    main()
