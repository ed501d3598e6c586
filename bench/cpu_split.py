"""Where the CPU of one trivial task goes, end to end: `python -m bench.cpu_split [--tasks N]`.

On two shared cores, end-to-end throughput is bounded by the CPU all processes spend per task,
not by any one process's latency. This runs N trivial tasks three ways on one private Redis and
one prefork worker (c=2), and reads each process's CPU time (user + system, children included
for the worker) from /proc before and after:

- push: 16 clients, `tools/call` then `subscriptions/listen` until the task ends (`bench.push`);
- poll: 16 clients, `tools/call` then `tasks/get` every 10 ms;
- raw: plain Celery, publish N then `.get()` each (the bench process is the client);
- create: 16 clients, `tools/call` only, with the worker running the jobs (the issue 26 creation
  window); its CPU is counted until Redis is idle again, its rate is the creation rate;
- floor: 16 clients, `tools/call` on the empty SDK server (`bench/floor_server.py`), no job.

Prints CPU ms per task for the server, the worker, Redis and the load client, and the rate.
CPU per task is steadier than rates on a machine shared with other work.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from bench import load, rpc
from bench.procs import PY, start_http_server, start_ours_server, start_worker, wait_worker
from bench.push import CONCURRENCY, poll_op, push_op
from bench.redis_tools import BenchRedis, idle_rates, wait_quiet
from mcp_celery.testing.processes import free_port

TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of `pid` and its live children (prefork pool processes), user + system."""
    total = 0.0
    pids = [pid]
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            pids += [int(p) for p in fh.read().split()]
    except OSError:
        pass
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / TICK
    return total


def self_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def split(pids: dict[str, int], run: object, tasks: int) -> dict[str, float]:
    """Run `run()` and return CPU ms per task of each process in `pids` (and 'client': this one), and the rate.

    The rate is over `run()`'s own time, or over the seconds it returns (work it waits for after the timed part).
    """
    before = {name: tree_cpu_s(pid) for name, pid in pids.items()}
    client0, t0 = self_cpu_s(), time.perf_counter()
    timed = run()  # type: ignore[operator]
    elapsed = timed if isinstance(timed, float) else time.perf_counter() - t0
    out = {name: (tree_cpu_s(pid) - before[name]) * 1000 / tasks for name, pid in pids.items()}
    out["client"] = (self_cpu_s() - client0) * 1000 / tasks
    out["rate"] = tasks / elapsed
    return out


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.cpu_split")
    ap.add_argument("--tasks", type=int, default=1500)
    a = ap.parse_args()
    rds = BenchRedis()
    rds.start()
    os.environ["BENCH_REDIS_URL"] = rds.url
    from bench import bench_jobs  # imported late: it reads BENCH_REDIS_URL

    worker = start_worker(rds.url, "worker-split")
    server = None
    try:
        server, url = start_ours_server(rds.url, "ours-split")
        wait_worker(bench_jobs.app, worker)
        assert rds.proc is not None
        pids = {"server": server.pid, "worker": worker.pid, "redis": rds.proc.pid}

        def closed_loop(op: load.Op) -> object:
            return lambda: asyncio.run(load.run_load(op, CONCURRENCY, count=a.tasks, warmup=0, deadline=600))

        def raw() -> None:
            results = [bench_jobs.raw_noop.apply_async((i,)) for i in range(a.tasks)]
            for result in results:
                result.get(timeout=120)

        def create_then_drain() -> float:
            t0 = time.perf_counter()
            create = lambda c, i: rpc.call_tool(c, url, "noop", {"x": i})  # noqa: E731
            asyncio.run(load.run_load(create, CONCURRENCY, count=a.tasks, warmup=0, deadline=600))
            elapsed = time.perf_counter() - t0
            wait_quiet(rds.client(), idle_cps, 120)  # the worker's jobs, counted in its CPU
            return elapsed

        port = free_port()
        floor_url = f"http://127.0.0.1:{port}/mcp"
        floor = start_http_server("floor-split", [PY, "-m", "bench.floor_server", str(port)], floor_url)
        raw()  # warm-up: the first publishes connect
        idle_cps, _ = idle_rates(rds.client(), 2.0)
        rows = {
            "push": split(pids, closed_loop(push_op(url)), a.tasks),
            "poll": split(pids, closed_loop(poll_op(url)), a.tasks),
            "raw": split(pids, raw, a.tasks),
            "create": split(pids, create_then_drain, a.tasks),
            "floor": split(
                {"server": floor.pid},
                closed_loop(lambda c, i: rpc.call_tool(c, floor_url, "noop", {"x": i})),
                a.tasks,
            ),
        }
        floor.stop()
        names = ["server", "worker", "redis", "client"]
        print("| way | " + " | ".join(f"{n} CPU ms/task" for n in names) + " | all | tasks/s |")
        print("|---|" + "---|" * (len(names) + 2))
        for way, row in rows.items():
            cells = [f"{row[n]:.2f}" if n in row else "" for n in names]
            all_ms = sum(row.get(n, 0.0) for n in names)
            print(f"| {way} | " + " | ".join(cells) + f" | {all_ms:.2f} | {row['rate']:.0f} |")
    finally:
        if server is not None:
            server.stop()
        worker.stop(timeout=15)
        rds.stop()


if __name__ == "__main__":
    main()
