"""Where a synchronous call's time goes, stage by stage: `python -m bench.sync_timeline [--calls N]`.

Issue 26 asks for a synchronous `tools/call` p50 at most 1.2x raw Celery's `delay().get()`, or a
profile showing the floor it sits on. A CPU profile (`bench.profile sync`) says what the server
spends, not when the call waits. This times each stage of each call on Redis's own clock:
`redis-cli MONITOR`, another process so that the timed client is not slowed by it, logs every
command with the time Redis ran it, and the client notes when it sent a call and when the answer
came (`time.time()`, the clock Redis stamps with). Commands belong to a call by the task id in them.

Calls go one at a time, in rounds of three: ours (a plain `tools/call` of the `noop` tool, which
waits for its job), raw Celery (`raw_noop.delay().get()`) and the empty SDK server's `tools/call`
(`bench/floor_server.py`: the HTTP and SDK round trip any server pays). It prints the median time of
each event from the call's start, for ours and raw Celery, and the floor's round trip. MONITOR
slows every command a little, both sides' alike.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx

from bench import rpc
from bench.procs import LOGS, PY, start_http_server, start_ours_server, start_worker, wait_worker
from bench.redis_tools import BenchRedis
from mcp_celery.testing.processes import free_port

#: One MONITOR line: `1764761234.123456 [0 127.0.0.1:50000] "HSET" "key" ...` (`[0 lua]` inside scripts).
LINE = re.compile(r'^(\d+\.\d+) \[\d+ ([^\]]+)\] "(\w+)"(.*)$')
TASK_KEY = re.compile(r"mcp-celery:task:\{([A-Za-z0-9_-]+)\}")


def plain_call(http: httpx.Client, url: str) -> None:
    headers, body = rpc.request("tools/call", {"name": "noop", "arguments": {"x": 1}}, "noop", declare=False)
    result = rpc.parse(http.post(url, content=body, headers=headers))
    if result.get("isError") or result.get("resultType") == "task":
        raise rpc.RpcError(f"not a synchronous result: {result}")


def read_monitor(path: Path) -> list[tuple[float, str, str, str]]:
    """(time, client, command, arguments) of every logged command, in order."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        m = LINE.match(line)
        if m:
            out.append((float(m[1]), m[2], m[3].upper(), m[4]))
    return out


def in_window(log: list[tuple[float, str, str, str]], t0: float, t1: float) -> list[tuple[float, str, str, str]]:
    return [e for e in log if t0 <= e[0] <= t1]


def ours_events(lines: list[tuple[float, str, str, str]], t0: float, t1: float) -> dict[str, float] | None:
    """Offsets (ms from the request's start) of the events of our call that Redis logged; None without its task.

    `lines` runs on past the answer (`t1`) up to the next call: Celery's own SUCCESS write may come after it.
    An event that did not happen is left out, not the call (a job that ends before its start was announced
    runs one script, not two): each event's median is over the calls that had it.
    """
    ids = [m[1] for e in lines if (m := TASK_KEY.search(e[3]))]
    if not ids:
        return None
    tid = ids[0]
    own = [e for e in lines if tid in e[3]]
    scripts = [e for e in own if e[2] == "EVALSHA"]
    firsts = {
        "watch subscribed (SUBSCRIBE)": next((e for e in own if e[2] == "SUBSCRIBE"), None),
        "creation written (pipeline)": next((e for e in own if e[2] == "HSET"), None),
        "job's start script": scripts[0] if len(scripts) > 1 else None,
        "the end script (PUBLISH)": scripts[-1] if scripts else None,
        "server reads the task": next((e for e in reversed(own) if e[2] == "HGETALL"), None),
        "Celery's SUCCESS write": next((e for e in reversed(own) if e[2] in ("SET", "SETEX")), None),
        "watch ended (UNSUBSCRIBE)": next((e for e in own if e[2] == "UNSUBSCRIBE"), None),
    }
    events = {name: e[0] - t0 for name, e in firsts.items() if e is not None}
    events["answer at the client"] = t1 - t0
    return events


def raw_events(lines: list[tuple[float, str, str, str]], t0: float, t1: float, tid: str) -> dict[str, float] | None:
    own = [e for e in lines if tid in e[3]]
    push = next((e for e in own if e[2] == "LPUSH"), None)
    meta = [e for e in own if e[2] in ("SET", "SETEX")]
    if push is None or len(meta) < 2:
        return None
    return {
        "message queued (LPUSH)": push[0] - t0,
        "STARTED write": meta[0][0] - t0,
        "SUCCESS write (and PUBLISH)": meta[-1][0] - t0,
        "answer at the client": t1 - t0,
    }


def medians(rows: list[dict[str, float]]) -> list[tuple[str, float, int]]:
    """Each event's median offset and how many calls had it, in the order they happen."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    found = [(k, [r[k] for r in rows if k in r]) for k in keys]
    return sorted(((k, 1000 * statistics.median(xs), len(xs)) for k, xs in found), key=lambda e: e[1])


def table(title: str, rows: list[dict[str, float]]) -> str:
    out = [
        f"{title} ({len(rows)} calls): median ms from the start of the call",
        "",
        "| event | at | stage | calls that had it |",
        "|---|---|---|---|",
    ]
    before = 0.0
    for name, at, n in medians(rows):
        out.append(f"| {name} | {at:.2f} | +{at - before:.2f} | {n} |")
        before = at
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.sync_timeline")
    ap.add_argument("--calls", type=int, default=300, help="rounds (one call of each kind per round)")
    a = ap.parse_args()
    rds = BenchRedis()
    rds.start()
    os.environ["BENCH_REDIS_URL"] = rds.url
    from bench import bench_jobs  # imported late: it reads BENCH_REDIS_URL

    worker = start_worker(rds.url, "worker-timeline")
    procs: list[Any] = [worker]
    monitor_log = LOGS / "sync-timeline-monitor.txt"
    monitor: subprocess.Popen[bytes] | None = None
    try:
        server, url = start_ours_server(rds.url, "ours-timeline")
        procs.append(server)
        port = free_port()
        floor_url = f"http://127.0.0.1:{port}/mcp"
        procs.append(start_http_server("floor-timeline", [PY, "-m", "bench.floor_server", str(port)], floor_url))
        wait_worker(bench_jobs.app, worker)
        http = httpx.Client(timeout=30)
        for _ in range(30):  # warm-up, unrecorded
            plain_call(http, url)
            bench_jobs.raw_noop.delay(1).get(timeout=30)
        with monitor_log.open("wb") as fh:
            monitor = subprocess.Popen(["redis-cli", "-p", str(rds.port), "monitor"], stdout=fh)
            time.sleep(0.5)  # MONITOR's OK before the first timed call
            ours: list[tuple[float, float]] = []
            raw: list[tuple[float, float, str]] = []
            floor: list[float] = []
            floor_headers, floor_body = rpc.request("tools/call", {"name": "noop", "arguments": {}}, "noop")
            for _ in range(a.calls):
                t0 = time.time()
                plain_call(http, url)
                ours.append((t0, time.time()))
                t0 = time.time()  # also where our call's window ends: its worker may still write
                res = bench_jobs.raw_noop.delay(1)
                res.get(timeout=30)
                raw.append((t0, time.time(), res.id))
                t0 = time.perf_counter()
                rpc.parse(http.post(floor_url, content=floor_body, headers=floor_headers))
                floor.append(time.perf_counter() - t0)
            time.sleep(0.5)
            monitor.terminate()
            monitor.wait(10)
        log = read_monitor(monitor_log)
        ends = [t0 for t0, _, _ in raw]  # each round's raw call starts after our call's answer
        windows = [(in_window(log, t0, end), t0, t1) for (t0, t1), end in zip(ours, ends, strict=True)]
        ours_rows = [r for lines, t0, t1 in windows if (r := ours_events(lines, t0, t1))]
        raw_rows = [r for t0, t1, tid in raw if (r := raw_events(in_window(log, t0, t1), t0, t1, tid))]
        print(table("ours: a plain tools/call of noop, answered with its result", ours_rows))
        print()
        print(table("raw Celery: raw_noop.delay(1).get()", raw_rows))
        print()
        print(f"floor: the empty SDK server's tools/call, median {1000 * statistics.median(floor):.2f} ms")
        unmatched = len(ours) - len(ours_rows), len(raw) - len(raw_rows)
        print(f"calls left out (ours: no task in the log; raw Celery: an event missing): {unmatched}")
        per_cmd: dict[str, int] = defaultdict(int)
        for (t0, _), end in zip(ours[:1], ends[:1], strict=True):
            for e in in_window(log, t0, end):
                per_cmd[f"{e[1]} {e[2]}"] += 1
        print("one call of ours, commands by client:", dict(per_cmd))
    finally:
        if monitor is not None and monitor.poll() is None:
            monitor.terminate()
        for p in reversed(procs):
            p.stop()
        rds.stop()


if __name__ == "__main__":
    main()
