"""Parking (issue 43): the resume after an answer against the blocking wait, and a store of parked tasks.

    python -m bench.parking [--rounds 40] [--few 100] [--parked 10000] [--ab-rounds 42] [--slice 0.5]
                            [--quick] [--out FILE]

One private redis-server on 127.0.0.1, started and stopped here, prefork workers and `mcp-celery serve
--http` processes for `bench.bench_jobs`. Two parts; `bench/results-parking.md` gets both (not with
--quick, a smoke test):

1. Resume latency, on `bench.input_latency`'s idle worker (-c 4) and server (DBs 14/15): `ask_parking`
   (park_after_s=0) and `ask_blocking` (park_after_s=None), the same job otherwise (one question,
   then `ctx.status("answered")`), in alternating rounds. Each round starts the task, waits until its
   job has parked (the record's `parked` field) or waits in its worker process (its Celery state
   INPUT_REQUIRED), leaves the worker idle for SETTLE_S, subscribes to the task's events channel and
   sends `tasks/update` from a second thread (t0). The job's next status is its "answered": timed to
   the first event after which the record's progress reads so (one HMGET per event), then on to the
   event after which its outcome is stored (the task completed).
2. Parked tasks: a side "few" (DBs 10/11) and a side "many" (DBs 12/13), each with its own server and
   a prefork worker (-c 4). On each, after one `noop` task (one-time keys go into the baseline) and
   Redis quiet, used_memory; then `--few` resp. `--parked` `ask_parking` tasks from 16 clients, until
   every record says parked and Redis is quiet again, and used_memory again: the difference per
   parked task. What one parked task stores: its keys, found as `bench.fill` finds a task's, with
   MEMORY USAGE. Then the workers stop (a parked task needs none), each side's server is replaced by
   a fresh process (the one that created 10,000 tasks is no warmer), and tasks/get c=1 on a random
   parked task of each side runs interleaved, as the stored-task A/B of `python -m bench`
   (bench.phases.ab).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx
import redis
from celery import Celery

from bench import fill, rpc
from bench.input_latency import TERMINAL, Probe, probe_on, redis_base
from bench.load import percentile_ms, run_load
from bench.phases.ab import ab_slices, ab_stats
from bench.procs import BENCH, CpuProbe, start_ours_server, start_worker, wait_worker
from bench.redis_tools import idle_rates, wait_quiet
from bench.results import ABFigures, Machine
from mcp_celery.store.schema import FIELD, Keys
from mcp_celery.testing.processes import Process, wait_for

TOOLS = ("ask_blocking", "ask_parking")  # park_after_s=None, park_after_s=0
SETTLE_S = 0.1  # the worker idle before the answer: a parked run has ended, a blocked job sits in BLPOP
GOAL_EXTRA_MS = 50.0  # the parked resume's p50 at most this far above the blocking wait's
GOAL_RATIO = 1.1  # tasks/get p50 with many parked at most this times the same with few
CREATORS = 16  # clients creating the parked tasks
WARM_UP_TASKS = 2 * CREATORS  # parked, then cancelled, before the baseline
KEYS = Keys()
ASKING = rpc.envelope({"extensions": {rpc.TASKS_EXT: {}}, "elicitation": {}})  # a client that can be asked


@dataclass
class Resume:
    """One answer, from sending tasks/update (seconds)."""

    status_s: float  # until the job's next status ("answered")
    done_s: float  # until its outcome is stored
    ack_s: float  # until tasks/update's answer is back


def resume_round(probe: Probe, tool: str) -> Resume:
    """Start `tool`, wait until its job parked or waits, answer, and time its next status and its end."""
    parks = tool == "ask_parking"
    task_id = probe.client.start(tool, {})
    record = KEYS.task(task_id)
    task = wait_for(lambda: probe.status_in(task_id, ("input_required",)), 30, 0.005, "input_required")
    (key,) = task["inputRequests"]
    if parks:
        wait_for(lambda: probe.results.hexists(record, FIELD.PARKED), 30, 0.002, "the job to park")
    else:
        meta_key = probe.backend.get_key_for_task(task_id)
        wait_for(lambda: probe.meta_status(meta_key) == "INPUT_REQUIRED", 30, 0.002, "the job to wait")
    time.sleep(SETTLE_S)
    if bool(probe.results.hexists(record, FIELD.PARKED)) != parks:
        raise RuntimeError(f"task {task_id} ({tool}): parked is {not parks} before the answer")
    sub = probe.results.pubsub()
    sub.subscribe(KEYS.events(task_id))
    wait_for(lambda: (m := sub.get_message(timeout=1)) is not None and m["type"] == "subscribe", 10, 0, "subscribe")
    answer = {"taskId": task_id, "inputResponses": {key: {"action": "accept", "content": {"confirm": True}}}}
    sent: dict[str, float] = {}

    def send() -> None:
        sent["t0"] = time.perf_counter()
        probe.client.result("tasks/update", answer, task_id)
        sent["ack"] = time.perf_counter()

    sender = threading.Thread(target=send)
    sender.start()
    status_at = done_at = None
    deadline = time.perf_counter() + 30
    try:
        while done_at is None:
            left = deadline - time.perf_counter()
            if left <= 0:
                raise RuntimeError(f"task {task_id} ({tool}): no outcome within 30 s of the answer")
            message = sub.get_message(timeout=left)
            if message is None or message["type"] != "message":
                continue
            progress, outcome = probe.results.hmget(record, [FIELD.PROGRESS, FIELD.OUTCOME])
            now = time.perf_counter()
            if status_at is None and (outcome or (progress and b'"answered"' in progress)):
                status_at = now
            if outcome:
                done_at = now
    finally:
        sub.close()
    sender.join(30)
    assert "ack" in sent and status_at is not None, "tasks/update got no answer"
    done = wait_for(lambda: probe.status_in(task_id, TERMINAL), 30, 0.02, "the task to end")
    assert done["status"] == "completed" and done["result"]["content"][0]["text"] == "published", done
    return Resume(status_at - sent["t0"], done_at - sent["t0"], sent["ack"] - sent["t0"])


@dataclass
class LatencyFigures:
    rounds: dict[str, list[Resume]] = field(default_factory=lambda: {tool: [] for tool in TOOLS})
    foreign_cpu: float = 0.0

    def of(self, tool: str, what: str, pct: float) -> float:
        return percentile_ms([getattr(r, what) for r in self.rounds[tool]], pct)


def measure_latency(base: str, rounds: int, warmup: int) -> LatencyFigures:
    """Alternating rounds of both tools on one idle worker and server (the order flips every round)."""
    figures = LatencyFigures()
    with probe_on(base) as probe:
        for _ in range(warmup):
            for tool in TOOLS:
                resume_round(probe, tool)
        before = CpuProbe.sample()
        for i in range(rounds):
            for tool in TOOLS if i % 2 == 0 else TOOLS[::-1]:
                figures.rounds[tool].append(resume_round(probe, tool))
        figures.foreign_cpu = CpuProbe.foreign(before, CpuProbe.sample())
    return figures


@dataclass
class StoredKey:
    """One key (or index entry) a parked task owns."""

    what: str  # as bench.fill describes it
    bytes: int | None  # MEMORY USAGE (None: an entry in a shared key)


@dataclass(frozen=True)
class Memory:
    """Redis's memory (bytes, MEMORY STATS): all of it, the keyspace's, the clients' buffers."""

    used: float  # used_memory (total.allocated)
    keyspace: float  # dataset.bytes and every database's key tables (overhead.hashtable.*)
    clients: float  # clients.normal: the clients' structures and buffers
    connected: int  # connected_clients

    @classmethod
    def read(cls, instance: redis.Redis) -> Memory:
        stats = instance.memory_stats()
        tables = sum(sum(v.values()) for k, v in stats.items() if k.startswith("db.") and isinstance(v, dict))
        connected = int(instance.info("clients")["connected_clients"])
        return cls(stats["total.allocated"], stats["dataset.bytes"] + tables, stats["clients.normal"], connected)

    def minus(self, before: Memory, per: int) -> Memory:
        """The difference from `before`, per one of `per` tasks (connected: the difference itself)."""
        return Memory(
            (self.used - before.used) / per,
            (self.keyspace - before.keyspace) / per,
            (self.clients - before.clients) / per,
            self.connected - before.connected,
        )


@dataclass
class Side:
    """A server over its own databases with `parked` parked tasks."""

    name: str
    parked: int
    backend_db: int  # the store's database
    url: str
    ids: list[str]
    memory_per_task: Memory  # bytes per parked task
    keys_per_task: float
    fill_s: float  # from the first creation until every record said parked
    stored: list[StoredKey] = field(default_factory=lambda: [])
    resume_field_b: int = 0  # the resume signature's bytes in the record


async def _ask_many(url: str, n: int) -> list[str]:
    """Create `n` ask_parking tasks from CREATORS clients; their ids."""
    ids: list[str] = []

    async def op(client: httpx.AsyncClient, i: int) -> None:
        headers, body = rpc.request("tools/call", {"name": "ask_parking", "arguments": {}}, "ask_parking", meta=ASKING)
        handle = rpc.parse(await client.post(url, content=body, headers=headers))
        if handle.get("resultType") != "task":
            raise rpc.RpcError(f"not a task: {handle}")
        ids.append(str(handle["taskId"]))

    res = await run_load(op, CREATORS, count=n, warmup=0, deadline=300, max_errors=5)
    if res.errors or len(ids) != n:
        raise RuntimeError(f"creating {n} parked tasks: {res.errors} errors, {len(ids)} created: {res.first_error}")
    return ids


async def _cancel_all(url: str, ids: list[str]) -> None:
    async with rpc.new_client() as client:
        for task_id in ids:
            await rpc.rpc(client, url, "tasks/cancel", {"taskId": task_id}, task_id)


def _count_parked(store: redis.Redis, ids: list[str]) -> int:
    with store.pipeline(transaction=False) as pipe:
        for task_id in ids:
            pipe.hexists(KEYS.task(task_id), FIELD.PARKED)
        return sum(1 for parked in pipe.execute() if parked)


def _quiet(r: redis.Redis) -> None:
    wait_quiet(r, idle_rates(r, 1.0)[0], 60, min_wait=0.5)


def side_env(base: str, backend_db: int) -> dict[str, str]:
    """The environment of a side's processes: its store's database, and the broker's just below it."""
    return {"BENCH_BROKER_URL": f"{base}/{backend_db - 1}", "BENCH_BACKEND_URL": f"{base}/{backend_db}"}


def open_side(base: str, name: str, backend_db: int, n: int, procs: list[Process]) -> Side:
    """The side's server (left running, in `procs`) and a worker (stopped at the end), `n` tasks parked."""
    env = side_env(base, backend_db)
    broker, backend = env["BENCH_BROKER_URL"], env["BENCH_BACKEND_URL"]
    brokers, store, instance = redis.Redis.from_url(broker), redis.Redis.from_url(backend), redis.Redis.from_url(base)
    brokers.flushdb()
    store.flushdb()
    server, url = start_ours_server(base, f"server-parking-{name}", env=env)
    procs.append(server)
    worker = start_worker(base, f"worker-parking-{name}", concurrency=4, env=env)
    try:
        wait_worker(Celery("bench-parking-ping", broker=broker), worker)
        # Warm-up: the server's connection pool at its size for CREATORS clients, the worker processes'
        # connections and scripts, one-time keys; the warm-up tasks are cancelled (their records stay).
        warm = asyncio.run(_ask_many(url, WARM_UP_TASKS))
        wait_for(lambda: _count_parked(store, warm) == len(warm), 60, 0.2, "the warm-up tasks to park")
        asyncio.run(_cancel_all(url, warm))
        _quiet(instance)
        memory0, keys0 = Memory.read(instance), brokers.dbsize() + store.dbsize()
        started = time.monotonic()
        ids = asyncio.run(_ask_many(url, n))
        wait_for(lambda: _count_parked(store, ids) == n, 600, 0.5, f"{n} tasks to park")
        fill_s = time.monotonic() - started
        _quiet(instance)
        memory1, keys1 = Memory.read(instance), brokers.dbsize() + store.dbsize()
    finally:
        worker.stop()
    return Side(name, n, backend_db, url, ids, memory1.minus(memory0, n), (keys1 - keys0) / n, fill_s)


def describe_one(base: str, side: Side) -> None:
    """What one parked task of `side` stores: its keys and index entries, with their MEMORY USAGE."""
    host_port = base.removeprefix("redis://")
    host, port = host_port.split(":")[0], int(host_port.split(":")[1])
    task_id = side.ids[0]
    for template in fill.discover(host, port, task_id):
        key = template.key.replace(fill.PH, task_id.encode())
        r = redis.Redis(host=host, port=port, db=template.db)
        size = None if template.index else int(r.memory_usage(key, samples=0) or 0)
        side.stored.append(StoredKey(template.describe(task_id.encode()), size))
    store = redis.Redis(host=host, port=port, db=side.backend_db)
    side.resume_field_b = int(store.hstrlen(KEYS.task(task_id), FIELD.RESUME))


def measure_store(
    base: str, few: int, many: int, ab_rounds: int, slice_s: float
) -> tuple[list[Side], ABFigures, ABFigures]:
    procs: list[Process] = []
    try:
        small = open_side(base, "few", 11, few, procs)
        describe_one(base, small)
        big = open_side(base, "many", 13, many, procs)
        # No worker runs now: tasks/get reads parked tasks only, from fresh server processes (the one that
        # created 10,000 tasks is no warmer than the others); a second one over the few parked tasks is the
        # control: its ratio to the first says how far two identical servers differ here.
        for proc in procs:
            proc.stop()
        procs.clear()
        urls = {}
        for name, side in (("many", big), ("few", small), ("control", small)):
            server, urls[name] = start_ours_server(
                base, f"server-parking-{name}-get", env=side_env(base, side.backend_db)
            )
            procs.append(server)
        rng = random.Random(43)
        picks: dict[str, Callable[[], str]] = {
            "many": lambda: big.ids[rng.randrange(len(big.ids))],
            "few": lambda: small.ids[rng.randrange(len(small.ids))],
            "control": lambda: small.ids[rng.randrange(len(small.ids))],
        }
        before = CpuProbe.sample()
        per_round, errors, first = asyncio.run(ab_slices(urls, picks, ab_rounds, slice_s, expect="input_required"))
        foreign = CpuProbe.foreign(before, CpuProbe.sample())
        if any(errors.values()):
            raise RuntimeError(f"interleaved tasks/get: errors {errors}, first: {first}")
        ab, control = ab_stats(per_round["many"], per_round["few"]), ab_stats(per_round["control"], per_round["few"])
        ab.slice_s, ab.foreign_cpu_share = slice_s, foreign
        return [small, big], ab, control
    finally:
        for proc in reversed(procs):
            proc.stop()


def report(
    cmdline: str, machine: Machine, latency: LatencyFigures, sides: list[Side], ab: ABFigures, control: ABFigures
) -> str:
    """bench/results-parking.md."""
    blocking, parking = TOOLS
    n = len(latency.rounds[blocking])
    extra = latency.of(parking, "status_s", 50) - latency.of(blocking, "status_s", 50)
    small, big = sides
    lines = [
        "# Parking: the resume after an answer, and parked tasks in Redis (`python -m bench.parking`)",
        "",
        f"`{cmdline}`, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC. One private redis-server {machine.redis_server} "
        f"on 127.0.0.1 (no persistence); {machine.cpu} x {machine.cores} cores shared by everything; "
        f"Python {machine.python}, celery {machine.packages.get('celery')}, redis-py {machine.packages.get('redis')}.",
        "",
        "## From `tasks/update` to the resumed job's next status",
        "",
        f"{n} rounds of each tool, alternating (the order flips every round), one task at a time, on one idle prefork "
        "worker (`-c 4`) and one `mcp-celery serve --http`: `ask_parking` (`park_after_s=0`: the run ends at the "
        "question, the answer sends the job's message again and it runs from the top, the question answered at once) "
        "and `ask_blocking` (`park_after_s=None`: the job waits for the answer in its worker process), the same job "
        'otherwise: one question, then `ctx.status("answered")`. Before each answer the job has parked (its '
        "record's `parked` field) or waits (its Celery state INPUT_REQUIRED), and the worker is left idle for "
        f"{SETTLE_S * 1000:.0f} ms. From sending `tasks/update` (from a second thread) to the first event on the "
        "task's channel after which its record's status reads \"answered\" (one HMGET per event, Redis pub/sub), "
        f"and to the one after which its outcome is stored. Other processes used {latency.foreign_cpu:.0%} of the "
        "machine's CPU meanwhile.",
        "",
        "| from tasks/update to | tool | p50 ms | p90 ms | min ms | max ms |",
        "|---|---|---|---|---|---|",
    ]
    for what, label in (("status_s", "the next status"), ("done_s", "completed"), ("ack_s", "its HTTP answer")):
        for tool in TOOLS:
            values = [getattr(r, what) for r in latency.rounds[tool]]
            lines.append(
                f"| {label} | `{tool}` | {percentile_ms(values, 50):.2f} | {percentile_ms(values, 90):.2f} | "
                f"{min(values) * 1000:.2f} | {max(values) * 1000:.2f} |"
            )
    p90_extra = latency.of(parking, "status_s", 90) - latency.of(blocking, "status_s", 90)
    lines += [
        "",
        f"{'MET' if extra <= GOAL_EXTRA_MS else 'MISSED'}  the parked job's next status at most {GOAL_EXTRA_MS:.0f} "
        f"ms above the blocking wait's, p50: {extra:+.2f} ms (p90: {p90_extra:+.2f} ms)",
        "",
        f"## {big.parked:,} parked tasks",
        "",
        f"Two sides on the same Redis, each with its own databases, server and prefork worker (`-c 4`): "
        f"{small.parked:,} and {big.parked:,} `ask_parking` tasks created from {CREATORS} clients, each parked at "
        "its question. Redis's memory (MEMORY STATS) was read with the side's server and worker idle, after "
        f"{WARM_UP_TASKS} tasks parked then cancelled (the server's connection pool at its size, the worker "
        "processes' connections and scripts, one-time keys), and again once every record said parked and Redis "
        "was quiet; the difference is divided by the parked tasks, and the keys (both databases of the side) "
        "likewise.",
        "",
        "Then the workers were stopped (a parked task needs none) and the servers replaced by fresh processes: one "
        "per side, and a second one over the few parked tasks, the control. `tasks/get` c=1 on a random parked "
        f"task ran interleaved, {ab.rounds} rounds of {ab.slice_s:g} s per server, the order running "
        "through all six permutations in turn; the first 3 requests of each slice not recorded, every answer "
        "checked to be `input_required`; p50 pooled per server, the 95% CI of each ratio from 400 bootstrap "
        "resamples of whole rounds (paired), as for the stored-task A/B of `python -m bench`. Other processes used "
        f"{ab.foreign_cpu_share:.0%} of the machine's CPU meanwhile.",
        "",
        f"| | {small.parked:,} parked | {big.parked:,} parked |",
        "|---|---|---|",
        f"| Redis used_memory per parked task, B | {small.memory_per_task.used:,.0f} | "
        f"{big.memory_per_task.used:,.0f} |",
        f"| of which the keyspace (dataset and key tables), B | {small.memory_per_task.keyspace:,.0f} | "
        f"{big.memory_per_task.keyspace:,.0f} |",
        f"| of which the clients' buffers, B | {small.memory_per_task.clients:,.0f} | "
        f"{big.memory_per_task.clients:,.0f} |",
        f"| keys per parked task | {small.keys_per_task:.2f} | {big.keys_per_task:.2f} |",
        f"| Redis clients connected, change between the readings | {small.memory_per_task.connected:+d} | "
        f"{big.memory_per_task.connected:+d} |",
        f"| created and parked in, s | {small.fill_s:.1f} | {big.fill_s:.1f} |",
        f"| tasks/get c=1 p50 ms (interleaved, {ab.big_samples + ab.small_samples:,} requests) | "
        f"{ab.small_p50_ms:.3f} | {ab.big_p50_ms:.3f} |",
        f"| per-round p50 min-max ms | {min(ab.small_round_p50s_ms):.2f}-{max(ab.small_round_p50s_ms):.2f} | "
        f"{min(ab.big_round_p50s_ms):.2f}-{max(ab.big_round_p50s_ms):.2f} |",
        "",
        f"{'MET' if ab.ratio <= GOAL_RATIO else 'MISSED'}  tasks/get p50 with {big.parked:,} parked within "
        f"{GOAL_RATIO}x of the same with {small.parked:,}: {ab.ratio:.3f}x (95% CI {ab.ci_low:.3f}-{ab.ci_high:.3f}x)",
        "",
        f"The control, a second server over the same {small.parked:,} parked tasks, against the first: "
        f"{control.ratio:.3f}x (95% CI {control.ci_low:.3f}-{control.ci_high:.3f}x), p50 {control.big_p50_ms:.3f} ms.",
        "",
        f"What one parked task stores (MEMORY USAGE of each key; the resume signature, the job's own Celery message, "
        f"is {small.resume_field_b:,} B of the record):",
        "",
    ]
    lines += [f"- {key.what}" + ("" if key.bytes is None else f": {key.bytes:,} B") for key in small.stored]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.parking", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40, help="resume rounds per tool (default 40)")
    parser.add_argument("--few", type=int, default=100, help="parked tasks on the small side (default 100)")
    parser.add_argument("--parked", type=int, default=10_000, help="parked tasks on the big side (default 10000)")
    parser.add_argument("--ab-rounds", type=int, default=42, help="interleaved tasks/get rounds (default 42)")
    parser.add_argument("--slice", type=float, default=0.5, help="seconds per side and round (default 0.5)")
    parser.add_argument("--quick", action="store_true", help="a smoke test: small counts, no results file")
    parser.add_argument("--out", type=Path, default=BENCH / "results-parking.md")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.parked, args.ab_rounds, args.slice = 5, 500, 6, 0.25
    cmdline = " ".join(["python -m bench.parking", *(sys.argv[1:] if argv is None else argv)])
    started = time.monotonic()
    with redis_base(None) as base:
        machine = Machine.collect(str(redis.Redis.from_url(base).info("server").get("redis_version")))
        latency = measure_latency(base, args.rounds, warmup=3)
        sides, ab, control = measure_store(base, args.few, args.parked, args.ab_rounds, args.slice)
    text = report(cmdline, machine, latency, sides, ab, control)
    print(text)
    if not args.quick:
        args.out.write_text(text)
        print(f"wrote {args.out}")
    print(f"({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
