"""Live output's delay, through the replica that created the task and through another: `python -m bench.live_output`.

Starts a private redis-server, one prefork worker (c=2) and two `mcp-celery serve --http` processes
(replicas A and B) on it. A job (`bench_jobs.output_stamps`) writes the wall clock as a line of live
output every 0.3 s, slower than the 4 updates a second a URI may get, so each line's update goes out
at once; a client on A (where the task was created) and one on B each listen with the output's URI in
`resourceSubscriptions` and, at every `notifications/resources/updated`, read the output
(`resources/read`) on the same replica. A line's delay is from its `ctx.output()` to the arrival of
the update after which the read had it (client and job share the machine's clock). Then a job writing
a line every 10 ms shows the batching: updates a second at a listener on B.

Writes bench/results-live-output.md and prints the same table.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path

from bench import procs, rpc
from bench.push import percentile
from mcp_celery.protocol import output_dropped, output_uri

BENCH = Path(__file__).resolve().parent
INTERVAL_S = 0.3
FAST_INTERVAL_S = 0.01


@dataclass
class Figures:
    delays_ms: dict[str, list[float]]  # replica -> each line's delay
    read_ms: list[float]  # the read after an update (either replica)
    updates: int  # updates of the fast job at the listener on B
    fast_lines: int
    fast_seconds: float


async def follow(url: str, task_id: str, lines: int) -> tuple[list[float], list[float]]:
    """Each line's delay (ms) at a listener on `url`, and how long each read after an update took (ms)."""
    uri = output_uri(task_id)
    delays: list[float] = []
    reads: list[float] = []
    seen = 0
    headers, body = rpc.request("subscriptions/listen", {"notifications": {"resourceSubscriptions": [uri]}}, uri)
    async with rpc.new_client() as listener, rpc.new_client() as reader:
        async with listener.stream("POST", url, headers=headers, content=body) as response:
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                message = json.loads(line[5:])
                if "result" in message or "error" in message:
                    break
                if message.get("method") != "notifications/resources/updated":
                    continue
                arrived = time.time()
                text = (await rpc.rpc(reader, url, "resources/read", {"uri": uri}, uri))["contents"][0]["text"]
                reads.append((time.time() - arrived) * 1000)
                stamps = output_dropped(text)[1].splitlines()
                delays += [(arrived - float(stamp[2:])) * 1000 for stamp in stamps[seen:]]
                seen = len(stamps)
                if seen >= lines:
                    break
    return delays, reads


async def count_updates(url: str, task_id: str) -> int:
    """The updates a listener on `url` gets until the task's stream ends."""
    uri = output_uri(task_id)
    headers, body = rpc.request("subscriptions/listen", {"notifications": {"resourceSubscriptions": [uri]}}, uri)
    updates = 0
    async with rpc.new_client() as client, client.stream("POST", url, headers=headers, content=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                message = json.loads(line[5:])
                if "result" in message or "error" in message:
                    return updates
                updates += message.get("method") == "notifications/resources/updated"
    return updates


async def measure(url_a: str, url_b: str, lines: int, fast_lines: int) -> Figures:
    async with rpc.new_client() as client:
        task = await rpc.call_tool(client, url_a, "output_stamps", {"count": lines, "interval_s": INTERVAL_S})
        (delays_a, reads_a), (delays_b, reads_b) = await asyncio.gather(
            follow(url_a, task["taskId"], lines), follow(url_b, task["taskId"], lines)
        )
        fast = await rpc.call_tool(
            client, url_a, "output_stamps", {"count": fast_lines, "interval_s": FAST_INTERVAL_S, "wait_s": 0.5}
        )
        started = time.perf_counter()
        updates = await count_updates(url_b, fast["taskId"])
        seconds = time.perf_counter() - started
    return Figures({"A": delays_a, "B": delays_b}, reads_a + reads_b, updates, fast_lines, seconds)


def run(quick: bool) -> Figures:
    with procs.worker_on_private_redis("live-output") as (redis_url, started):
        servers = [procs.start_ours_server(redis_url, f"live-output-server-{name}") for name in ("a", "b")]
        started += [server for server, _ in servers]
        (_, url_a), (_, url_b) = servers
        asyncio.run(measure(url_a, url_b, 5, 20))  # warm-up
        return asyncio.run(measure(url_a, url_b, 20 if quick else 100, 100 if quick else 300))


def report(f: Figures) -> str:
    rows = []
    for replica, where in (("A", "the replica that created the task"), ("B", "another replica")):
        p50, p95 = percentile(f.delays_ms[replica], 50), percentile(f.delays_ms[replica], 95)
        rows.append((f"ctx.output() to notifications/resources/updated, p50, {where}", f"{p50:.2f} ms", p50 < 100))
        rows.append((f"the same, p95, {where}", f"{p95:.2f} ms", None))
    rows.append(("resources/read after the update (has the line), p50", f"{percentile(f.read_ms, 50):.2f} ms", None))
    rate = f.updates / f.fast_seconds
    rows.append(
        (
            f"updates at a listener on B, {f.fast_lines} lines {FAST_INTERVAL_S * 1000:.0f} ms apart "
            "(from the listen to the stream's end, the job's 0.5 s wait included)",
            f"{f.updates} in {f.fast_seconds:.2f} s = {rate:.2f}/s",
            rate <= 4.5,
        )
    )
    lines = [
        "# Live output (`python -m bench.live_output`)",
        "",
        f"One run, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, one private redis-server, one prefork "
        f"worker (c=2), two `mcp-celery serve --http` processes (A created the task; B is another replica); "
        f"{len(f.delays_ms['A'])} lines {INTERVAL_S * 1000:.0f} ms apart, each read at both replicas.",
        "",
        "| figure | measured | goal | |",
        "|---|---|---|---|",
    ]
    goals = ["under 100 ms", "", "under 100 ms", "", "", "at most 4 a second (+ the last)"]
    for (name, value, met), goal in zip(rows, goals, strict=True):
        verdict = "" if met is None else ("MET" if met else "MISSED")
        lines.append(f"| {name} | {value} | {goal or '(reference)'} | {verdict} |")
    for replica in ("A", "B"):
        delays = f.delays_ms[replica]
        lines.append(
            f"\nDelay at {replica}: min {min(delays):.2f} ms, mean {sum(delays) / len(delays):.2f} ms, "
            f"max {max(delays):.2f} ms."
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    out = BENCH / "results-live-output.md"
    procs.report_main("bench.live_output", __doc__ or "", out, lambda quick: report(run(quick)))


if __name__ == "__main__":
    main()
