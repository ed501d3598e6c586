"""Profile the mcp-celery server under one kind of load with py-spy.

python -m bench.profile {create,get,sync,e2e} [--seconds S] [--concurrency C]

Starts a private Redis, a prefork worker and `mcp-celery serve`, runs the load while `py-spy record`
samples the server process (and its threads), then prints the top functions by inclusive and by self time
(from py-spy's collapsed-stack output) and writes bench/.logs/profile-<what>.txt (collapsed stacks, feed it to
any flame graph tool) and profile-<what>-summary.txt.
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

from bench import load
from bench.__main__ import create_many, e2e_op, start_worker, wait_http, wait_worker
from bench.procs import LOGS, BenchRedis, spare_port, start, wait_port


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
    return "\n".join(out)


async def drive(what: str, url: str, seconds: float, conc: int) -> load.LoadResult:
    if what == "create":

        async def op(c, i):  # type: ignore[no-untyped-def]
            await load.call_tool(c, url, "noop", {"x": i})
    elif what == "sync":

        async def op(c, i):  # type: ignore[no-untyped-def]
            await load.call_tool(c, url, "noop", {"x": i}, declare=False)
    elif what == "get":
        ids = await create_many(url, 500, 4)
        await asyncio.sleep(2)

        async def op(c, i):  # type: ignore[no-untyped-def]
            await load.tasks_get(c, url, ids[i % len(ids)])
    else:
        op = await e2e_op(url)
    return await load.run_load(op, conc, duration=seconds, warmup=1.0, deadline=seconds + 120)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.profile")
    ap.add_argument("what", choices=["create", "get", "sync", "e2e"])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples/s")
    a = ap.parse_args()
    pyspy = shutil.which("py-spy")
    if not pyspy:
        sys.exit("py-spy not installed: pip install py-spy")
    rds = BenchRedis()
    rds.start()
    os.environ["BENCH_REDIS_URL"] = rds.url
    from bench import bench_jobs

    port = spare_port()
    w = start_worker(rds.url, "worker-prof")
    mcpc = shutil.which("mcp-celery")
    s = start(
        "ours-prof",
        [
            mcpc or sys.executable,
            *([] if mcpc else ["-m", "mcp_celery"]),
            "serve",
            "-A",
            "bench.bench_jobs",
            "--http",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        env={"BENCH_REDIS_URL": rds.url},
    )
    out = LOGS / f"profile-{a.what}.txt"
    spy = None
    try:
        wait_worker(bench_jobs.app, w)
        wait_port(port, 30, s.popen)
        url = f"http://127.0.0.1:{port}/mcp"
        asyncio.run(wait_http(url, 20, s))
        spy = subprocess.Popen(
            [
                pyspy,
                "record",
                "--pid",
                str(s.pid),
                "--rate",
                str(a.rate),
                "--format",
                "raw",
                "--output",
                str(out),
                "--duration",
                str(int(a.seconds + 3)),
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(0.5)
        res = asyncio.run(drive(a.what, url, a.seconds, a.concurrency))
        print(f"{a.what}: {res.summary()}")
        spy.wait(timeout=60)
        summary = summarize(out)
        (LOGS / f"profile-{a.what}-summary.txt").write_text(summary)
        print(summary)
    finally:
        if spy is not None and spy.poll() is None:
            spy.terminate()
        s.stop()
        w.stop()
        rds.stop()


if __name__ == "__main__":
    main()
