"""python -m bench [--quick] [--skip PHASE ...]: run every phase, print a table, write bench/results.md."""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx

from bench import load
from bench.procs import (
    BENCH,
    BenchRedis,
    CpuProbe,
    Proc,
    cmd_delta,
    commandstats,
    connections_received,
    reads_processed,
    spare_port,
    start,
    wait_port,
)

PY = sys.executable
FASTMCP_PY = BENCH / ".venv-fastmcp" / "bin" / "python"
POLL_S = 0.010  # e2e: sleep between tasks/get polls (same for ours and FastMCP)


@dataclass
class Cfg:
    quick: bool
    dur: float  # seconds per recorded load window
    warm: float  # seconds of warm-up per window
    n_mem: int  # tasks in the commands / memory window
    n_e2e: int  # tasks in the e2e window
    n_raw_lat: int
    n_raw_e2e: int
    n_sync: int
    n_cmd_get: int
    fill_to: int
    ab_rounds: int  # interleaved scaling A/B: rounds of (one slice on the big store, one on the small one)
    ab_slice: float  # seconds per slice
    ab_small: int  # tasks stored in the small store


def make_cfg(quick: bool) -> Cfg:
    if quick:
        return Cfg(True, 1.5, 0.3, 300, 300, 100, 300, 100, 200, 20_000, 20, 0.15, 1000)
    return Cfg(False, 5.0, 1.0, 1000, 3000, 500, 3000, 500, 1000, 1_000_000, 40, 0.25, 1000)


R: dict[str, Any] = {}  # all figures, flat keys
NOTES: list[str] = []
FOREIGN: list[tuple[str, float]] = []  # (window, share of CPU used by processes that are not the bench's)
LOG: list[str] = []


def say(msg: str) -> None:
    line = f"[{time.strftime('%H:%M:%S')}] {msg}"
    print(line, flush=True)
    LOG.append(line)


# --------------------------------------------------------------------------------------------- helpers
async def wait_http(url: str, deadline_s: float, proc: Proc | None = None) -> None:
    end = time.monotonic() + deadline_s
    last: Exception | None = None
    async with load.new_client() as c:
        while time.monotonic() < end:
            if proc is not None and not proc.alive():
                raise RuntimeError(f"{proc.name} exited: {proc.tail()}")
            try:
                await c.post(url, content=b"{}", headers={"Content-Type": "application/json"})
                return
            except httpx.HTTPError as e:
                last = e
                await asyncio.sleep(0.1)
    raise TimeoutError(f"{url} not up in {deadline_s}s: {last!r}")


def idle_rates(r: Any, seconds: float) -> tuple[float, float]:
    """Commands/s and read events/s on Redis with nothing but background polling (worker, server)."""
    c0, rd0 = commandstats(r), reads_processed(r)
    time.sleep(seconds)
    c1, rd1 = commandstats(r), reads_processed(r)
    return sum(cmd_delta(c0, c1).values()) / seconds, (rd1 - rd0 - 2) / seconds


def wait_quiet(r: Any, idle_cps: float, deadline_s: float, min_wait: float = 0.2) -> float:
    """Wait until Redis command traffic falls back to the idle rate (the worker has drained the queue)."""
    time.sleep(min_wait)
    end = time.monotonic() + deadline_s
    prev = sum(cmd_delta({}, commandstats(r)).values())
    quiet = 0
    t0 = time.monotonic()
    while time.monotonic() < end:
        time.sleep(0.1)
        cur = sum(cmd_delta({}, commandstats(r)).values())
        if cur - prev <= idle_cps * 0.1 + 3:
            quiet += 1
            if quiet >= 3:
                return time.monotonic() - t0
        else:
            quiet = 0
        prev = cur
    raise TimeoutError("Redis did not go quiet (queue not drained)")


def top_cmds(d: dict[str, int], n: float, k: int = 12) -> str:
    return ", ".join(f"{c} {v / n:.2f}" for c, v in sorted(d.items(), key=lambda kv: -kv[1])[:k])


def record_load(prefix: str, res: load.LoadResult) -> None:
    R[f"{prefix}.p50"] = res.p50
    R[f"{prefix}.p95"] = res.p95
    R[f"{prefix}.rate"] = res.rate
    R[f"{prefix}.n"] = res.n
    R[f"{prefix}.errors"] = res.errors
    R[f"{prefix}.foreign"] = res.foreign_cpu
    FOREIGN.append((prefix, res.foreign_cpu))
    say(f"  {prefix}: {res.summary()}")
    if res.errors:
        NOTES.append(f"{prefix}: {res.errors} errors, first: {res.first_error[:300]}")


# --------------------------------------------------------------------------------------------- machine
def machine_info(redis_version: str) -> None:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "?"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    vers = {}
    for pkg in ("mcp", "celery", "kombu", "redis", "uvicorn", "starlette", "httpx", "mcp-celery"):
        try:
            vers[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            vers[pkg] = "-"
    R["machine"] = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory": mem,
        "python": platform.python_version(),
        "redis_server": redis_version,
        "os": platform.platform(),
        **vers,
    }


# --------------------------------------------------------------------------------------------- ceiling and floor
async def phase_ceiling(cfg: Cfg) -> None:
    port = spare_port()
    p = start("ceiling", [PY, "-m", "bench.ceiling_server", str(port)])
    try:
        url = f"http://127.0.0.1:{port}/"
        await wait_http(url, 20, p)
        for c in (1, 16):
            res = await load.run_load(
                lambda cl, i: load.call_tool(cl, url, "noop", {"x": i}), c, duration=cfg.dur, warmup=cfg.warm
            )
            record_load(f"ceiling.c{c}", res)
    finally:
        p.stop()


async def phase_floor(cfg: Cfg) -> None:
    port = spare_port()
    p = start("floor", [PY, "-m", "bench.floor_server", str(port)])
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        await wait_http(url, 20, p)
        for c in (1, 16):
            res = await load.run_load(
                lambda cl, i: load.call_tool(cl, url, "noop", {"x": i}), c, duration=cfg.dur, warmup=cfg.warm
            )
            record_load(f"floor.call.c{c}", res)
        for c in (1, 16):
            res = await load.run_load(
                lambda cl, i: load.tasks_get(cl, url, f"t{i % 1000:032d}"), c, duration=cfg.dur, warmup=cfg.warm
            )
            record_load(f"floor.get.c{c}", res)
    finally:
        p.stop()


# --------------------------------------------------------------------------------------------- Celery worker
def start_worker(redis_url: str, name: str) -> Proc:
    celery = shutil.which("celery") or "celery"
    p = start(
        name,
        [
            celery,
            "-A",
            "bench.bench_jobs",
            "worker",
            "-P",
            "prefork",
            "-c",
            "2",
            "--without-gossip",
            "--without-mingle",
            "-l",
            "WARNING",
            "-n",
            f"{name}@%h",
        ],
        env={"BENCH_REDIS_URL": redis_url},
    )
    return p


def wait_worker(app: Any, proc: Proc, deadline_s: float = 30) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if not proc.alive():
            raise RuntimeError(f"worker exited: {proc.tail()}")
        try:
            if app.control.ping(timeout=0.5):
                return
        except Exception:  # noqa: BLE001
            pass
        time.sleep(0.2)
    raise TimeoutError(f"worker not up in {deadline_s}s: {proc.tail()}")


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))] * 1000


def phase_raw_celery(cfg: Cfg, rds: BenchRedis) -> None:
    from celery.result import AsyncResult

    from bench import bench_jobs

    app = bench_jobs.app
    keys = (
        "task_acks_late",
        "worker_prefetch_multiplier",
        "worker_disable_prefetch",
        "task_track_started",
        "result_extended",
        "worker_send_task_events",
        "task_send_sent_event",
        "result_expires",
    )
    R["raw.config"] = "mcp_celery.configure_app(app): " + ", ".join(f"{k}={app.conf.get(k)!r}" for k in keys)
    r = rds.client()
    w = start_worker(rds.url, "worker-raw")
    try:
        wait_worker(app, w)
        task = bench_jobs.raw_noop
        for i in range(50):  # warm-up
            task.delay(i).get(timeout=10)
        idle_cps, idle_rps = idle_rates(r, 2.0 if not cfg.quick else 1.0)
        R["raw.idle_cps"] = idle_cps
        # apply_async latency
        lat = []
        ids = []
        for i in range(cfg.n_raw_lat):
            t0 = time.perf_counter()
            ar = task.apply_async((i,))
            lat.append(time.perf_counter() - t0)
            ids.append(ar.id)
        R["raw.apply.p50"], R["raw.apply.p95"] = pct(lat, 50), pct(lat, 95)
        wait_quiet(r, idle_cps, 60)
        # delay().get() round trip
        cpu0 = CpuProbe.sample()
        lat = []
        for i in range(cfg.n_raw_lat):
            t0 = time.perf_counter()
            task.delay(i).get(timeout=10)
            lat.append(time.perf_counter() - t0)
        R["raw.rt.p50"], R["raw.rt.p95"] = pct(lat, 50), pct(lat, 95)
        FOREIGN.append(("raw.rt", CpuProbe.foreign(cpu0, CpuProbe.sample())))
        say(
            f"  raw apply_async p50 {R['raw.apply.p50']:.2f}ms; delay().get() p50 {R['raw.rt.p50']:.2f}ms "
            f"p95 {R['raw.rt.p95']:.2f}ms"
        )
        # Redis commands per task: publish N (no get), wait for the worker to drain
        n = cfg.n_mem
        c0, m0, t0 = commandstats(r), int(r.info("memory")["used_memory"]), time.monotonic()
        for i in range(n):
            task.apply_async((i,))
        wait_quiet(r, idle_cps, 120)
        c1, m1, dt = commandstats(r), int(r.info("memory")["used_memory"]), time.monotonic() - t0
        d = cmd_delta(c0, c1)
        R["raw.cmds_per_task"] = (sum(d.values()) - idle_cps * dt) / n
        R["raw.cmds_per_task.raw"] = sum(d.values()) / n
        R["raw.cmds_breakdown"] = top_cmds(d, n)
        R["raw.mem_per_task"] = (m1 - m0) / n
        say(f"  raw Redis cmds/task {R['raw.cmds_per_task']:.2f} (idle-corrected; {R['raw.cmds_breakdown']})")
        # end-to-end: publish N, then get all
        n = cfg.n_raw_e2e
        cpu0 = CpuProbe.sample()
        t0 = time.perf_counter()
        ars = [task.apply_async((i,)) for i in range(n)]
        t_pub = time.perf_counter() - t0
        for ar in ars:
            ar.get(timeout=120)
        R["raw.e2e.rate"] = n / (time.perf_counter() - t0)
        R["raw.publish.rate"] = n / t_pub
        FOREIGN.append(("raw.e2e", CpuProbe.foreign(cpu0, CpuProbe.sample())))
        say(f"  raw e2e {R['raw.e2e.rate']:.0f} tasks/s (publish {R['raw.publish.rate']:.0f} msg/s)")
        # AsyncResult(id).state reads/s on finished tasks (single thread), and commands per read
        fin = [a.id for a in ars]
        k, t0 = 0, time.perf_counter()
        c0 = commandstats(r)
        end = t0 + cfg.dur
        while time.perf_counter() < end:
            st = AsyncResult(fin[k % len(fin)], app=app).state
            assert st == "SUCCESS", st
            k += 1
        el = time.perf_counter() - t0
        c1 = commandstats(r)
        R["raw.state.rate"] = k / el
        d = cmd_delta(c0, c1)
        R["raw.cmds_per_state"] = (sum(d.values()) - idle_cps * el) / k
        say(f"  raw AsyncResult.state {R['raw.state.rate']:.0f}/s, {R['raw.cmds_per_state']:.2f} cmds/read")
    finally:
        w.stop(timeout=15)


# --------------------------------------------------------------------------------------------- task servers
async def e2e_op(url: str, tool: str = "noop") -> Any:
    async def op(c: httpx.AsyncClient, i: int) -> None:
        h = await load.call_tool(c, url, tool, {"x": i})
        if h.get("resultType") != "task":
            raise load.RpcError(f"not a task: {h}")
        tid = h["taskId"]
        end = time.monotonic() + 60
        while True:
            await asyncio.sleep(POLL_S)
            g = await load.tasks_get(c, url, tid)
            st = g.get("status")
            if st == "completed":
                return
            if st in ("failed", "cancelled"):
                raise load.RpcError(f"task {tid} {st}: {g}")
            if time.monotonic() > end:
                raise TimeoutError(f"task {tid} still {st}")

    return op


async def create_many(url: str, n: int, conc: int, deadline_s: float = 300) -> list[str]:
    ids: list[str] = []

    async def op(c: httpx.AsyncClient, i: int) -> None:
        h = await load.call_tool(c, url, "noop", {"x": i})
        if h.get("resultType") != "task":
            raise load.RpcError(f"not a task: {h}")
        ids.append(h["taskId"])

    res = await load.run_load(op, conc, count=n, warmup=0, deadline=deadline_s, max_errors=5)
    if res.errors:
        raise RuntimeError(f"create_many: {res.errors} errors: {res.first_error}")
    return ids


async def all_completed(url: str, ids: list[str], conc: int = 8) -> int:
    """tasks/get every id; returns how many are completed."""
    done = 0
    it = iter(ids)

    async def w() -> None:
        nonlocal done
        async with load.new_client() as c:
            for tid in it:
                g = await load.tasks_get(c, url, tid)
                done += g.get("status") == "completed"

    await asyncio.gather(*(w() for _ in range(conc)))
    return done


async def measure_task_server(tag: str, cfg: Cfg, rds: BenchRedis, url: str, *, fill_phase: bool) -> None:
    """Common measurements for a SEP-2663 server (ours or FastMCP) on the bench Redis."""
    r = rds.client()
    # sanity + warm-up
    async with load.new_client() as c:
        h = await load.call_tool(c, url, "noop", {"x": 7})
        if h.get("resultType") != "task" or "taskId" not in h:
            raise RuntimeError(f"{tag}: tools/call did not return a task handle: {h}")
        R[f"{tag}.handle_example"] = {k: v for k, v in h.items() if k != "_meta"}
    warm = await load.run_load(await e2e_op(url), 4, count=40 if cfg.quick else 100, warmup=0, deadline=60)
    if warm.errors:
        raise RuntimeError(f"{tag} warm-up e2e failed: {warm.first_error}")
    idle_cps, idle_rps = idle_rates(r, 2.0 if not cfg.quick else 1.0)
    R[f"{tag}.idle_cps"], R[f"{tag}.idle_rps"] = idle_cps, idle_rps
    say(f"  {tag} idle Redis traffic: {idle_cps:.1f} cmds/s, {idle_rps:.1f} reads/s")

    # 1. commands + memory per task: create N (no polling), wait for the worker to drain
    n = cfg.n_mem
    c0, m0, t0 = commandstats(r), int(r.info("memory")["used_memory"]), time.monotonic()
    ids = await create_many(url, n, 4)
    wait_quiet(r, idle_cps, 120)
    c1, m1, dt = commandstats(r), int(r.info("memory")["used_memory"]), time.monotonic() - t0
    d = cmd_delta(c0, c1)
    R[f"{tag}.cmds_per_task"] = (sum(d.values()) - idle_cps * dt) / n
    R[f"{tag}.cmds_per_task.raw"] = sum(d.values()) / n
    R[f"{tag}.cmds_breakdown"] = top_cmds(d, n)
    R[f"{tag}.mem_per_task"] = (m1 - m0) / n
    done = await all_completed(url, ids)
    if done != n:
        NOTES.append(f"{tag}: only {done}/{n} tasks completed after the drain")
    say(
        f"  {tag} Redis cmds per tools/call+job {R[f'{tag}.cmds_per_task']:.2f} ({R[f'{tag}.cmds_breakdown']}); "
        f"memory {R[f'{tag}.mem_per_task']:.0f} B/task"
    )
    stored = sum(v.get("keys", 0) for k, v in r.info("keyspace").items())
    R[f"{tag}.keys_after_mem"] = stored
    sample = ids[:]

    # 2. tasks/get on finished tasks: latency c=1 (with ~1,000 stored tasks), c=16
    get_op = lambda c, i: load.tasks_get(c, url, sample[i % len(sample)])  # noqa: E731
    res = await load.run_load(get_op, 1, duration=cfg.dur, warmup=cfg.warm)
    record_load(f"{tag}.get.c1", res)
    R[f"{tag}.get1k.p50"] = res.p50
    # commands and Redis read events (≈ round trips) per tasks/get, sequential
    k = cfg.n_cmd_get
    async with load.new_client() as c:
        for i in range(20):
            await load.tasks_get(c, url, sample[i])
        c0, rd0, t0 = commandstats(r), reads_processed(r), time.monotonic()
        for i in range(k):
            await load.tasks_get(c, url, sample[i % len(sample)])
        rd1, c1, dt = reads_processed(r), commandstats(r), time.monotonic() - t0
    d = cmd_delta(c0, c1)
    R[f"{tag}.cmds_per_get"] = (sum(d.values()) - idle_cps * dt) / k
    R[f"{tag}.cmds_per_get.raw"] = sum(d.values()) / k
    R[f"{tag}.get_breakdown"] = top_cmds(d, k)
    R[f"{tag}.rt_per_get"] = (rd1 - rd0 - 1 - idle_rps * dt) / k  # -1: the INFO that reads the counter
    say(
        f"  {tag} per tasks/get: {R[f'{tag}.cmds_per_get']:.2f} cmds ({R[f'{tag}.get_breakdown']}), "
        f"{R[f'{tag}.rt_per_get']:.2f} Redis round trips"
    )

    # tasks/get at 1,000,000 stored tasks (A/B/A': ~1k, fill, 1M, delete the synthetic ones, ~1k again)
    if fill_phase:
        await fill_and_measure(tag, cfg, rds, url, sample)

    res = await load.run_load(get_op, 16, duration=cfg.dur, warmup=cfg.warm)
    record_load(f"{tag}.get.c16", res)

    # 3. tools/call-to-handle c=1 and c=16 (the worker runs the created jobs meanwhile)
    async def create_op(c: httpx.AsyncClient, i: int) -> None:
        h = await load.call_tool(c, url, "noop", {"x": i})
        if h.get("resultType") != "task":
            raise load.RpcError(f"not a task: {h}")

    for conc in (1, 16):
        res = await load.run_load(create_op, conc, duration=cfg.dur, warmup=cfg.warm)
        record_load(f"{tag}.call.c{conc}", res)
        wait_quiet(r, idle_cps, 180)

    # 4. end to end at c=16
    res = await load.run_load(await e2e_op(url), 16, count=cfg.n_e2e, warmup=cfg.warm, deadline=300)
    record_load(f"{tag}.e2e.c16", res)
    wait_quiet(r, idle_cps, 60)

    # 5. synchronous path: no extension declared -> plain CallToolResult
    async def sync_op(c: httpx.AsyncClient, i: int) -> None:
        res_ = await load.call_tool(c, url, "noop", {"x": i}, declare=False)
        if res_.get("resultType") == "task" or "content" not in res_:
            raise load.RpcError(f"not a CallToolResult: {res_}")

    res = await load.run_load(sync_op, 1, count=cfg.n_sync, warmup=cfg.warm, deadline=120)
    record_load(f"{tag}.sync.c1", res)
    k = 100
    async with load.new_client() as c:
        c0, n0, t0 = commandstats(r), connections_received(r), time.monotonic()
        for i in range(k):
            await sync_op(c, i)
        n1, c1, dt = connections_received(r), commandstats(r), time.monotonic() - t0
    d = cmd_delta(c0, c1)
    R[f"{tag}.sync_conns"] = (n1 - n0) / k
    R[f"{tag}.sync_cmds"] = (sum(d.values()) - idle_cps * dt) / k
    R[f"{tag}.sync_breakdown"] = top_cmds(d, k)
    say(
        f"  {tag} sync path per call: {R[f'{tag}.sync_cmds']:.1f} Redis cmds ({R[f'{tag}.sync_breakdown']}), "
        f"{R[f'{tag}.sync_conns']:.2f} new Redis connections"
    )


def redis_read_p50(rds: BenchRedis, templates: list[Any], ids: list[str], n: int = 3000) -> float:
    """Redis-level p50 (µs) of one pipelined read of a task's per-task keys, from a sync client."""
    from bench import fill

    per = [t for t in templates if not t.index and t.db == 0 and t.kind in ("hash", "string")]
    r = rds.client()
    lat = []
    for i in range(n):
        tid = ids[i % len(ids)].encode()
        p = r.pipeline(transaction=False)
        for t in per:
            key = t.key.replace(fill.PH, tid)
            p.hgetall(key) if t.kind == "hash" else p.get(key)
        t0 = time.perf_counter()
        p.execute()
        lat.append(time.perf_counter() - t0)
    return pct(lat, 50) * 1000  # µs


async def ab_slices(
    urls: dict[str, str], pick: dict[str, Callable[[], str]], rounds: int, slice_s: float, skip: int = 3
) -> tuple[dict[str, list[list[float]]], dict[str, int], str]:
    """Interleaved c=1 tasks/get on several servers: `rounds` rounds of one `slice_s` slice per server.

    The order within a round alternates (A B, B A, ...) so neither side always follows the other. One
    keep-alive client per server for the whole run; the first `skip` requests of each slice are not recorded
    (the server that was idle during the other slice wakes up). One unrecorded warm-up round comes first.
    Returns per server the latencies (seconds) of each round, the error counts and the first error.
    """
    names = list(urls)
    per_round: dict[str, list[list[float]]] = {n: [] for n in names}
    errors = dict.fromkeys(names, 0)
    first_err = ""
    clients = {n: load.new_client() for n in names}
    try:
        for rnd in range(-1, rounds):  # round -1: warm-up
            order = names if rnd % 2 == 0 else names[::-1]
            for n in order:
                c, url, lat, k = clients[n], urls[n], [], 0
                end = time.monotonic() + (2 * slice_s if rnd < 0 else slice_s)
                while time.monotonic() < end:
                    tid = pick[n]()
                    t0 = time.perf_counter()
                    try:
                        g = await load.tasks_get(c, url, tid)
                        dt = time.perf_counter() - t0
                        if g.get("status") != "completed":
                            raise load.RpcError(f"task {tid} is {g.get('status')!r}, not completed")
                    except Exception as e:  # noqa: BLE001
                        errors[n] += 1
                        first_err = first_err or f"{n}: {e!r}"
                        if errors[n] > 50:
                            raise RuntimeError(f"interleaved A/B: too many errors, first: {first_err}") from e
                        continue
                    k += 1
                    if k > skip:
                        lat.append(dt)
                if rnd >= 0:
                    per_round[n].append(lat)
    finally:
        await asyncio.gather(*(c.aclose() for c in clients.values()), return_exceptions=True)
    return per_round, errors, first_err


def ab_stats(big: list[list[float]], small: list[list[float]], resamples: int = 400) -> dict[str, Any]:
    """Pooled p50 per side (ms), their ratio, per-round p50s and a paired-round bootstrap 95% CI of the ratio."""
    rounds = [i for i in range(min(len(big), len(small))) if big[i] and small[i]]
    if not rounds:
        raise RuntimeError("interleaved A/B: no samples")
    flat_b = [x for i in rounds for x in big[i]]
    flat_s = [x for i in rounds for x in small[i]]
    p_b, p_s = pct(flat_b, 50), pct(flat_s, 50)
    rb = [pct(big[i], 50) for i in rounds]
    rs = [pct(small[i], 50) for i in rounds]
    rng = random.Random(2663)  # fixed seed: the CI is a function of the samples only
    boot = []
    for _ in range(resamples):
        pick = [rounds[rng.randrange(len(rounds))] for _ in rounds]
        boot.append(pct([x for i in pick for x in big[i]], 50) / pct([x for i in pick for x in small[i]], 50))
    boot.sort()
    return {
        "big.p50": p_b,
        "small.p50": p_s,
        "big.n": len(flat_b),
        "small.n": len(flat_s),
        "ratio": p_b / p_s,
        "ci_lo": boot[int(0.025 * (len(boot) - 1))],
        "ci_hi": boot[int(0.975 * (len(boot) - 1))],
        "big.rounds": rb,
        "small.rounds": rs,
        "round_ratios": [b / s for b, s in zip(rb, rs, strict=True)],
        "rounds": len(rounds),
    }


async def scaling_ab(tag: str, cfg: Cfg, big_url: str, sample0: str, templates: list[Any], n_big: int) -> None:
    """Interleaved A/B for the stored-task scaling goal.

    "big": the bench Redis right after the fill (n_big synthetic tasks + the real ones) and its server.
    "small": a second private Redis holding cfg.ab_small synthetic tasks cloned from the same templates, and a
    second, identical `mcp-celery serve` process over it (no worker: tasks/get only reads). Both are measured
    in alternating short slices so that drift of the machine hits both sides equally.
    """
    from bench import fill

    small = BenchRedis("redis-small")
    srv: Proc | None = None
    try:
        small.start()
        secs = fill.fill("127.0.0.1", small.port, sample0, templates, cfg.ab_small, deadline_s=60)
        small.settle()
        small_keys = sum(v.get("keys", 0) for k, v in small.client().info("keyspace").items())
        srv, port = start_ours_server(small.url, "ours-server-small")
        wait_port(port, 30, srv.popen)
        small_url = f"http://127.0.0.1:{port}/mcp"
        await wait_http(small_url, 20, srv)
        say(
            f"  {tag} A/B: small Redis port {small.port} (pid {small.proc.pid if small.proc else '?'}), "
            f"{cfg.ab_small} synthetic tasks in {secs:.1f}s ({small_keys} keys); small server pid {srv.pid}"
        )
        n_small = cfg.ab_small
        cpu0 = CpuProbe.sample()
        per_round, errors, first = await ab_slices(
            {"big": big_url, "small": small_url},
            {
                "big": lambda: fill.synthetic_id(sample0, random.randint(1, n_big)),
                "small": lambda: fill.synthetic_id(sample0, random.randint(1, n_small)),
            },
            cfg.ab_rounds,
            cfg.ab_slice,
        )
        foreign = CpuProbe.foreign(cpu0, CpuProbe.sample())
        FOREIGN.append((f"{tag}.ab", foreign))
        if any(errors.values()):
            NOTES.append(f"{tag} interleaved A/B: errors {errors}, first: {first[:300]}")
        st = ab_stats(per_round["big"], per_round["small"])
        for k, v in st.items():
            R[f"{tag}.ab.{k}"] = v
        R[f"{tag}.ab.small_stored"] = n_small
        R[f"{tag}.ab.slice"] = cfg.ab_slice
        R[f"{tag}.ab.small_keys"] = small_keys
        R[f"{tag}.ab.foreign"] = foreign
        say(
            f"  {tag} A/B {st['rounds']} rounds x {cfg.ab_slice:g}s: big p50 {st['big.p50']:.3f}ms "
            f"(n={st['big.n']}, rounds {min(st['big.rounds']):.2f}-{max(st['big.rounds']):.2f}), small p50 "
            f"{st['small.p50']:.3f}ms (n={st['small.n']}, rounds {min(st['small.rounds']):.2f}-"
            f"{max(st['small.rounds']):.2f}); big/small {st['ratio']:.3f} (95% CI {st['ci_lo']:.3f}-"
            f"{st['ci_hi']:.3f}); foreign-cpu {foreign:.0%}"
        )
    finally:
        if srv is not None:
            srv.stop()
            if srv.popen.returncode not in (0, -15, None):
                NOTES.append(f"{tag} small server exit code {srv.popen.returncode}; log tail: {srv.tail(10)}")
        small.stop()


async def fill_and_measure(tag: str, cfg: Cfg, rds: BenchRedis, url: str, sample: list[str]) -> None:
    from bench import fill

    r = rds.client()
    templates = fill.discover("127.0.0.1", rds.port, sample[0])
    R[f"{tag}.redis_read1k"] = redis_read_p50(rds, templates, sample)
    R[f"{tag}.fill.templates"] = [t.describe(sample[0].encode()) for t in templates]
    mem_one = 0
    for t in templates:
        if not t.index:
            key = t.key.replace(fill.PH, sample[0].encode())
            mem_one += int(rds.client(t.db).memory_usage(key) or 0)
    R[f"{tag}.mem_usage_one_task"] = mem_one
    say(
        f"  {tag} records of one finished task: "
        + "; ".join(R[f"{tag}.fill.templates"])
        + f"; MEMORY USAGE sum {mem_one} B"
    )
    if not templates:
        NOTES.append(f"{tag}: no task records found for the fill")
        return
    done = await all_completed(url, sample)
    if done != len(sample):
        NOTES.append(f"{tag}: {len(sample) - done} sample tasks not completed before the fill")
    per_task = [t for t in templates if not t.index][0]
    pattern = per_task.key.replace(fill.PH, b"*")
    real = sum(1 for _ in rds.client(per_task.db).scan_iter(match=pattern, count=5000))
    R[f"{tag}.real_tasks_stored"] = real
    n_fill = max(0, cfg.fill_to - real)  # top up to fill_to; the earlier phases created `real`
    stored_before = sum(v.get("keys", 0) for k, v in r.info("keyspace").items())
    m0 = int(r.info("memory")["used_memory"])
    secs = fill.fill("127.0.0.1", rds.port, sample[0], templates, n_fill, deadline_s=400)
    m1 = int(r.info("memory")["used_memory"])
    R[f"{tag}.fill.n"] = n_fill
    R[f"{tag}.fill.secs"] = secs
    R[f"{tag}.fill.mem_per_task"] = (m1 - m0) / max(1, n_fill)
    R[f"{tag}.fill.settle_s"] = rds.settle()
    R[f"{tag}.redis_read1m"] = redis_read_p50(rds, templates, sample)
    stored_after = sum(v.get("keys", 0) for k, v in r.info("keyspace").items())
    say(
        f"  {tag} filled {n_fill} synthetic tasks in {secs:.1f}s ({stored_before} -> {stored_after} keys, "
        f"{R[f'{tag}.fill.mem_per_task']:.0f} B/task)"
    )
    # check that synthetic tasks are served
    async with load.new_client() as c:
        g = await load.tasks_get(c, url, fill.synthetic_id(sample[0], 12345 % max(1, n_fill) + 1))
        R[f"{tag}.fill.synthetic_status"] = g.get("status")
    res = await load.run_load(
        lambda c, i: load.tasks_get(c, url, sample[i % len(sample)]), 1, duration=cfg.dur, warmup=cfg.warm
    )
    record_load(f"{tag}.get1m.c1", res)
    R[f"{tag}.get1m.p50"] = res.p50
    ids = [fill.synthetic_id(sample[0], random.randint(1, max(1, n_fill))) for _ in range(2000)]
    res = await load.run_load(
        lambda c, i: load.tasks_get(c, url, ids[i % len(ids)]), 1, duration=cfg.dur, warmup=cfg.warm
    )
    record_load(f"{tag}.get1m_synth.c1", res)
    R[f"{tag}.stored_total"] = real + n_fill
    try:
        await scaling_ab(tag, cfg, url, sample[0], templates, max(1, n_fill))
    except Exception as e:  # noqa: BLE001
        NOTES.append(f"{tag}: interleaved scaling A/B failed: {e!r}")
        say(f"  {tag} interleaved scaling A/B FAILED: {e!r}\n{traceback.format_exc()}")
    R[f"{tag}.redis_read1m_after"] = redis_read_p50(rds, templates, sample)
    secs = fill.fill("127.0.0.1", rds.port, sample[0], templates, n_fill, deadline_s=300, delete=True)
    say(f"  {tag} deleted the {n_fill} synthetic tasks in {secs:.1f}s")
    res = await load.run_load(
        lambda c, i: load.tasks_get(c, url, sample[i % len(sample)]), 1, duration=cfg.dur, warmup=cfg.warm
    )
    record_load(f"{tag}.get1k_after.c1", res)
    R[f"{tag}.get1k_after.p50"] = res.p50


def start_ours_server(redis_url: str, name: str) -> tuple[Proc, int]:
    """`mcp-celery serve -A bench.bench_jobs --http` on a spare loopback port, over the Redis at redis_url."""
    mcpc = shutil.which("mcp-celery")
    argv = [mcpc] if mcpc else [PY, "-m", "mcp_celery"]
    port = spare_port()
    s = start(
        name,
        argv + ["serve", "-A", "bench.bench_jobs", "--http", "--host", "127.0.0.1", "--port", str(port)],
        env={"BENCH_REDIS_URL": redis_url},
    )
    return s, port


async def phase_ours(cfg: Cfg, rds: BenchRedis) -> None:
    from bench import bench_jobs  # imported late: it reads BENCH_REDIS_URL, which amain() sets

    w = start_worker(rds.url, "worker-ours")
    s, port = start_ours_server(rds.url, "ours-server")
    try:
        wait_worker(bench_jobs.app, w)
        wait_port(port, 30, s.popen)
        url = f"http://127.0.0.1:{port}/mcp"
        await wait_http(url, 20, s)
        await measure_task_server("ours", cfg, rds, url, fill_phase=True)
    finally:
        s.stop()
        w.stop(timeout=15)
        if s.popen.returncode not in (0, -15, None):
            NOTES.append(f"ours server exit code {s.popen.returncode}; log tail: {s.tail(10)}")


def ensure_fastmcp_venv() -> bool:
    """Create bench/.venv-fastmcp with the pinned FastMCP packages if it is not there yet."""
    if FASTMCP_PY.exists():
        return True
    say("  creating bench/.venv-fastmcp (fastmcp==4.1.4, fastmcp-tasks==4.1.4; they exclude our redis-py)")
    venv = FASTMCP_PY.parent.parent
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, "fastmcp==4.1.4", "fastmcp-tasks==4.1.4"], check=True, timeout=900)
    except (subprocess.SubprocessError, OSError) as exc:
        NOTES.append(f"fastmcp: could not create bench/.venv-fastmcp ({exc}); phase skipped")
        return False
    return FASTMCP_PY.exists()


async def phase_fastmcp(cfg: Cfg, rds: BenchRedis) -> None:
    if not ensure_fastmcp_venv():
        say("  fastmcp venv missing, skipped")
        return
    port = spare_port()
    s = start("fastmcp-server", [str(FASTMCP_PY), str(BENCH / "fastmcp_server.py"), str(port), f"{rds.url}/0"])
    try:
        wait_port(port, 60, s.popen)
        url = f"http://127.0.0.1:{port}/mcp"
        await wait_http(url, 30, s)
        await measure_task_server("fastmcp", cfg, rds, url, fill_phase=False)
    finally:
        s.stop()


# --------------------------------------------------------------------------------------------- report
def f(key: str, fmt: str = "{:.2f}") -> str:
    v = R.get(key)
    if v is None:
        return "n/a"
    try:
        return fmt.format(v)
    except (ValueError, TypeError):
        return str(v)


def ratio(a: str, b: str) -> str:
    x, y = R.get(a), R.get(b)
    if x is None or y is None or not y:
        return "n/a"
    return f"{x / y:.2f}×"


def goals() -> list[tuple[str, str, str]]:
    out: list[tuple[str, str, str]] = []

    def g(name: str, ok: bool | None, fig: str) -> None:
        out.append((name, "n/a" if ok is None else ("MET" if ok else "MISSED"), fig))

    def have(*ks: str) -> bool:
        return all(R.get(k) is not None for k in ks)

    if have("ours.call.c1.p50", "floor.call.c1.p50"):
        x = R["ours.call.c1.p50"] / R["floor.call.c1.p50"]
        g(
            "tools/call-to-handle p50 ≤ 1.7× floor p50",
            x <= 1.7,
            f"{R['ours.call.c1.p50']:.2f} ms vs floor {R['floor.call.c1.p50']:.2f} ms = {x:.2f}×",
        )
    else:
        g("tools/call-to-handle p50 ≤ 1.7× floor p50", None, "not measured")
    if have("ours.get.c1.p50", "floor.get.c1.p50"):
        x = R["ours.get.c1.p50"] / R["floor.get.c1.p50"]
        g(
            "tasks/get p50 ≤ 1.25× floor p50",
            x <= 1.25,
            f"{R['ours.get.c1.p50']:.2f} ms vs floor {R['floor.get.c1.p50']:.2f} ms = {x:.2f}×",
        )
    else:
        g("tasks/get p50 ≤ 1.25× floor p50", None, "not measured")
    if have("ours.get.c16.rate", "floor.get.c16.rate"):
        x = R["ours.get.c16.rate"] / R["floor.get.c16.rate"]
        g(
            "tasks/get req/s at c=16 ≥ 80% of floor",
            x >= 0.8,
            f"{R['ours.get.c16.rate']:.0f}/s vs floor {R['floor.get.c16.rate']:.0f}/s = {x:.0%}",
        )
    else:
        g("tasks/get req/s at c=16 ≥ 80% of floor", None, "not measured")
    if have("ours.e2e.c16.rate", "raw.e2e.rate"):
        x = R["ours.e2e.c16.rate"] / R["raw.e2e.rate"]
        g(
            "e2e trivial throughput ≥ 70% of raw Celery",
            x >= 0.7,
            f"{R['ours.e2e.c16.rate']:.0f} vs raw {R['raw.e2e.rate']:.0f} tasks/s = {x:.0%}",
        )
    else:
        g("e2e trivial throughput ≥ 70% of raw Celery", None, "not measured")
    if have("ours.rt_per_get", "ours.cmds_per_get"):
        rt, cm = R["ours.rt_per_get"], R["ours.cmds_per_get"]
        g(
            "tasks/get: 1 Redis round trip and ≤ 3 commands",
            rt <= 1.1 and cm <= 3.05,
            f"{rt:.2f} round trips, {cm:.2f} commands ({R.get('ours.get_breakdown')})",
        )
    else:
        g("tasks/get: 1 Redis round trip and ≤ 3 commands", None, "not measured")
    if have("ours.cmds_per_task", "raw.cmds_per_task"):
        x = R["ours.cmds_per_task"] - R["raw.cmds_per_task"]
        g(
            "tools/call + job bookkeeping ≤ raw Celery + 8 Redis commands per job",
            x <= 8,
            f"{R['ours.cmds_per_task']:.1f} vs raw {R['raw.cmds_per_task']:.1f} = +{x:.1f}",
        )
    else:
        g("tools/call + job bookkeeping ≤ raw Celery + 8 Redis commands per job", None, "not measured")
    if have("ours.mem_per_task"):
        x = R["ours.mem_per_task"]
        g(
            "Redis memory ≤ 2 KB per finished task",
            x <= 2048,
            f"{x:.0f} B/task (used_memory delta over {R.get('ours.n_mem', '')} tasks; "
            f"MEMORY USAGE of one task's keys {R.get('ours.mem_usage_one_task', 'n/a')} B)",
        )
    else:
        g("Redis memory ≤ 2 KB per finished task", None, "not measured")
    if have("ours.ab.ratio", "ours.ab.big.p50", "ours.ab.small.p50"):
        x = R["ours.ab.ratio"]
        seq = ""
        if have("ours.get1k.p50", "ours.get1m.p50"):
            base = (R["ours.get1k.p50"] + R.get("ours.get1k_after.p50", R["ours.get1k.p50"])) / 2
            seq = f"; supporting, sequential windows on one server: {R['ours.get1m.p50'] / base - 1:+.1%}"
        g(
            "tasks/get p50 within 10% between 1,000 and 1,000,000 stored tasks",
            abs(x - 1) <= 0.10,
            f"interleaved A/B ({R['ours.ab.rounds']} rounds): {R['ours.ab.big.p50']:.3f} ms "
            f"({R.get('ours.stored_total', 0):,} stored) vs {R['ours.ab.small.p50']:.3f} ms "
            f"({R.get('ours.ab.small_stored', 0):,} stored) = {x:.3f}× (paired-round bootstrap 95% CI "
            f"{R['ours.ab.ci_lo']:.3f}–{R['ours.ab.ci_hi']:.3f}×){seq}",
        )
    elif have("ours.get1k.p50", "ours.get1m.p50"):
        base = (R["ours.get1k.p50"] + R.get("ours.get1k_after.p50", R["ours.get1k.p50"])) / 2
        x = R["ours.get1m.p50"] / base - 1
        g(
            "tasks/get p50 within 10% between 1,000 and 1,000,000 stored tasks",
            None,
            f"interleaved A/B not measured; sequential windows only (not drift-robust): "
            f"{R['ours.get1k.p50']:.2f} ms (~{R.get('ours.real_tasks_stored', 0):,} stored) → "
            f"{R['ours.get1m.p50']:.2f} ms ({R.get('ours.stored_total', 0):,} stored) → "
            f"{R.get('ours.get1k_after.p50', float('nan')):.2f} ms after deleting the synthetic ones; "
            f"{x:+.1%} vs the mean of the two ~1k windows",
        )
    else:
        g("tasks/get p50 within 10% between 1,000 and 1,000,000 stored tasks", None, "not measured")
    return out


def table() -> str:
    rows: list[tuple[str, str, str, str, str]] = []  # metric, floor/ceiling, ours, raw celery, fastmcp

    def row(name: str, floor: str = "", ours: str = "", raw: str = "", fm: str = "") -> None:
        rows.append((name, floor, ours, raw, fm))

    row("client ceiling (raw ASGI) c=1 p50 / p95 ms", f"{f('ceiling.c1.p50')} / {f('ceiling.c1.p95')}")
    row("client ceiling c=1 / c=16 req/s", f"{f('ceiling.c1.rate', '{:.0f}')} / {f('ceiling.c16.rate', '{:.0f}')}")
    for c in (1, 16):
        row(
            f"tools/call→handle c={c} p50 / p95 ms",
            f"{f(f'floor.call.c{c}.p50')} / {f(f'floor.call.c{c}.p95')}",
            f"{f(f'ours.call.c{c}.p50')} / {f(f'ours.call.c{c}.p95')}",
            f"apply_async {f('raw.apply.p50')} / {f('raw.apply.p95')}" if c == 1 else "",
            f"{f(f'fastmcp.call.c{c}.p50')} / {f(f'fastmcp.call.c{c}.p95')}",
        )
        row(
            f"tools/call→handle c={c} calls/s",
            f(f"floor.call.c{c}.rate", "{:.0f}"),
            f(f"ours.call.c{c}.rate", "{:.0f}"),
            f"publish {f('raw.publish.rate', '{:.0f}')} msg/s" if c == 16 else "",
            f(f"fastmcp.call.c{c}.rate", "{:.0f}"),
        )
    for c in (1, 16):
        row(
            f"tasks/get c={c} p50 / p95 ms",
            f"{f(f'floor.get.c{c}.p50')} / {f(f'floor.get.c{c}.p95')}",
            f"{f(f'ours.get.c{c}.p50')} / {f(f'ours.get.c{c}.p95')}",
            "",
            f"{f(f'fastmcp.get.c{c}.p50')} / {f(f'fastmcp.get.c{c}.p95')}",
        )
        row(
            f"tasks/get c={c} req/s",
            f(f"floor.get.c{c}.rate", "{:.0f}"),
            f(f"ours.get.c{c}.rate", "{:.0f}"),
            f"AsyncResult.state {f('raw.state.rate', '{:.0f}')}/s (1 thread)" if c == 1 else "",
            f(f"fastmcp.get.c{c}.rate", "{:.0f}"),
        )
    row(
        "e2e trivial job, tasks/s (MCP: c=16 create+poll; raw: publish N then get all)",
        "",
        f("ours.e2e.c16.rate", "{:.0f}"),
        f("raw.e2e.rate", "{:.0f}"),
        f("fastmcp.e2e.c16.rate", "{:.0f}"),
    )
    row(
        "e2e per-task latency c=16 p50 / p95 ms",
        "",
        f"{f('ours.e2e.c16.p50')} / {f('ours.e2e.c16.p95')}",
        "",
        f"{f('fastmcp.e2e.c16.p50')} / {f('fastmcp.e2e.c16.p95')}",
    )
    row(
        "sync path (no extension) c=1 p50 / p95 ms; raw: delay().get()",
        f"{f('floor.call.c1.p50')} / {f('floor.call.c1.p95')}",
        f"{f('ours.sync.c1.p50')} / {f('ours.sync.c1.p95')}",
        f"{f('raw.rt.p50')} / {f('raw.rt.p95')}",
        f"{f('fastmcp.sync.c1.p50')} / {f('fastmcp.sync.c1.p95')}",
    )
    row(
        "Redis cmds per job (create + worker, idle-corrected)",
        "",
        f("ours.cmds_per_task", "{:.1f}"),
        f("raw.cmds_per_task", "{:.1f}"),
        f("fastmcp.cmds_per_task", "{:.1f}"),
    )
    row(
        "Redis cmds per tasks/get (raw: per .state read)",
        "",
        f("ours.cmds_per_get"),
        f("raw.cmds_per_state"),
        f("fastmcp.cmds_per_get"),
    )
    row("Redis round trips per tasks/get", "", f("ours.rt_per_get"), "", f("fastmcp.rt_per_get"))
    row(
        "Redis used_memory per finished task, B",
        "",
        f("ours.mem_per_task", "{:.0f}"),
        f("raw.mem_per_task", "{:.0f}"),
        f("fastmcp.mem_per_task", "{:.0f}"),
    )
    row(
        f"tasks/get c=1 p50 ms, interleaved A/B: {R.get('ours.stored_total', 0):,} / "
        f"{R.get('ours.ab.small_stored', 0):,} stored (big / small = ratio, 95% CI)",
        "",
        f"{f('ours.ab.big.p50', '{:.3f}')} / {f('ours.ab.small.p50', '{:.3f}')} = {f('ours.ab.ratio', '{:.3f}')}× "
        f"({f('ours.ab.ci_lo', '{:.3f}')}–{f('ours.ab.ci_hi', '{:.3f}')}×)",
    )
    rb, rs, rr = R.get("ours.ab.big.rounds"), R.get("ours.ab.small.rounds"), R.get("ours.ab.round_ratios")
    row(
        f"  interleaved A/B per-round p50 min–max ms ({R.get('ours.ab.rounds', 0)} rounds × "
        f"{R.get('ours.ab.slice', 0):g} s per side): big / small; per-round ratio min–median–max",
        "",
        f"{min(rb):.2f}–{max(rb):.2f} / {min(rs):.2f}–{max(rs):.2f}; "
        f"{min(rr):.2f}–{statistics.median(rr):.2f}–{max(rr):.2f}"
        if rb and rs and rr
        else "n/a",
    )
    row(
        f"tasks/get c=1 p50 ms @ ~{R.get('ours.real_tasks_stored', 1000):,} stored (before / after the fill)",
        "",
        f"{f('ours.get1k.p50')} / {f('ours.get1k_after.p50')}",
        "",
        f("fastmcp.get1k.p50"),
    )
    row(
        f"tasks/get c=1 p50 ms @ {R.get('ours.stored_total', 0):,} stored (real ids / synthetic ids)",
        "",
        f"{f('ours.get1m.p50')} / {f('ours.get1m_synth.c1.p50')}",
    )
    row(
        "Redis-level read of one task (pipelined, sync client) p50 µs @ ~1k / 1M / 1M after the windows",
        "",
        f"{f('ours.redis_read1k', '{:.0f}')} / {f('ours.redis_read1m', '{:.0f}')} / "
        f"{f('ours.redis_read1m_after', '{:.0f}')}",
    )
    row(
        "sync path: Redis cmds / new Redis connections per call",
        "",
        f"{f('ours.sync_cmds', '{:.1f}')} / {f('ours.sync_conns')}",
        "",
        "",
    )
    head = ("metric", "floor / ceiling", "ours (mcp-celery)", "raw Celery", "FastMCP 4.1.4")
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(5)]
    lines = [
        "| " + " | ".join(h.ljust(widths[i]) for i, h in enumerate(head)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += ["| " + " | ".join(c.ljust(widths[i]) for i, c in enumerate(r)) + " |" for r in rows]
    return "\n".join(lines)


def ratios() -> str:
    items = [
        ("tools/call→handle p50 c=1, ours / floor", ratio("ours.call.c1.p50", "floor.call.c1.p50")),
        ("tools/call→handle p50 c=1, ours / FastMCP", ratio("ours.call.c1.p50", "fastmcp.call.c1.p50")),
        ("tools/call→handle p50 c=1, ours / raw apply_async", ratio("ours.call.c1.p50", "raw.apply.p50")),
        ("calls/s c=16, ours / floor", ratio("ours.call.c16.rate", "floor.call.c16.rate")),
        ("calls/s c=16, ours / FastMCP", ratio("ours.call.c16.rate", "fastmcp.call.c16.rate")),
        ("tasks/get p50 c=1, ours / floor", ratio("ours.get.c1.p50", "floor.get.c1.p50")),
        ("tasks/get p50 c=1, ours / FastMCP", ratio("ours.get.c1.p50", "fastmcp.get.c1.p50")),
        ("tasks/get req/s c=16, ours / floor", ratio("ours.get.c16.rate", "floor.get.c16.rate")),
        ("tasks/get req/s c=16, ours / FastMCP", ratio("ours.get.c16.rate", "fastmcp.get.c16.rate")),
        ("tasks/get req/s c=1, ours / raw AsyncResult.state reads/s", ratio("ours.get.c1.rate", "raw.state.rate")),
        ("e2e tasks/s, ours / raw Celery", ratio("ours.e2e.c16.rate", "raw.e2e.rate")),
        ("e2e tasks/s, ours / FastMCP", ratio("ours.e2e.c16.rate", "fastmcp.e2e.c16.rate")),
        ("sync path p50, ours / floor tools/call", ratio("ours.sync.c1.p50", "floor.call.c1.p50")),
        ("sync path p50, ours / raw delay().get()", ratio("ours.sync.c1.p50", "raw.rt.p50")),
        ("Redis cmds per job, ours / raw Celery", ratio("ours.cmds_per_task", "raw.cmds_per_task")),
        ("Redis cmds per job, ours / FastMCP", ratio("ours.cmds_per_task", "fastmcp.cmds_per_task")),
        ("Redis cmds per tasks/get, ours / FastMCP", ratio("ours.cmds_per_get", "fastmcp.cmds_per_get")),
        ("floor c=16 req/s / client ceiling c=16", ratio("floor.call.c16.rate", "ceiling.c16.rate")),
    ]
    return "\n".join(f"| {a} | {b} |" for a, b in [("ratio", "value"), ("---", "---")] + items)


def report(cfg: Cfg, started: float, cmdline: str) -> str:
    m = R.get("machine", {})
    out = [
        f"# mcp-celery benchmark results ({'quick' if cfg.quick else 'full'} run)",
        "",
        f"Generated by `{cmdline}` on {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, wall time "
        f"{time.time() - started:.0f} s.",
        "",
        "## Machine",
        "",
        f"- CPU: {m.get('cpu')} × {m.get('cores')} cores; memory {m.get('memory')}; {m.get('os')}",
        f"- Python {m.get('python')}; Redis server {m.get('redis_server')} (private instance on a spare loopback port, "
        "no persistence)",
        "- packages: "
        + ", ".join(
            f"{k} {m.get(k)}"
            for k in ("mcp", "celery", "kombu", "redis", "uvicorn", "starlette", "httpx", "mcp-celery")
        ),
        "- FastMCP baseline: fastmcp 4.1.4 + fastmcp-tasks 4.1.4 (pydocket) in bench/.venv-fastmcp",
        "- Everything (load client, servers, Celery worker prefork -c 2, Redis) shares the same cores.",
        "",
        "## Method",
        "",
        "- Load client: asyncio, one `httpx.AsyncClient` (1 keep-alive connection) per concurrent worker, closed "
        "loop; raw JSON-RPC 2026-07-28 POSTs with the `_meta` envelope (tasks extension declared, or `{}` "
        "capabilities for the sync path) and `MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name` headers.",
        f"- Each load window: {cfg.warm:g} s warm-up, then {cfg.dur:g} s recorded (counts where stated).",
        "- Floor: mcp lowlevel `Server`, constant `CallToolResult` and an empty custom `tasks/get` handler, "
        "`streamable_http_app(stateless_http=True, json_response=True)` on uvicorn (same uvicorn defaults as "
        "the servers under test). Client ceiling: raw ASGI app returning a fixed JSON body on uvicorn.",
        "- Celery worker for raw Celery and ours: `celery -A bench.bench_jobs worker -P prefork -c 2 "
        "--without-gossip --without-mingle -l WARNING`; app config: " + str(R.get("raw.config")) + ".",
        "- e2e for MCP servers: each of 16 workers creates a task then polls `tasks/get` every "
        f"{POLL_S * 1000:g} ms until `completed`; raw Celery: publish N with `apply_async`, then `.get()` all.",
        "- Redis commands: `INFO commandstats` deltas (INFO itself excluded; commands run inside Lua/MULTI are "
        "counted by Redis too), minus the idle background rate (worker/server polling) measured over 2 s. "
        "Per job: create N tasks without polling, wait until Redis traffic returns to idle. Round trips per "
        "tasks/get: `total_reads_processed` delta (one read event per request batch) per sequential tasks/get, "
        "idle-corrected. Memory: `used_memory` delta over the same N finished tasks.",
        "- Stored-task scaling: the per-task records of one real finished task are discovered with SCAN/TYPE "
        "(keys named by the task id, plus index members mentioning it), then cloned server-side by a Lua loop "
        "(EVALSHA, 20,000 synthetic ids per call, same types/values/TTLs with the id substituted); "
        "tasks/get p50 is re-measured on the same real ids, and on synthetic ids.",
        "- Stored-task scaling verdict (interleaved A/B): consecutive windows of one server on this machine drift "
        "by ±10–20%, more than the effect being tested, so the goal is judged on an interleaved comparison: while "
        'the bench Redis holds the filled store ("big"), a second private redis-server is started and given '
        f'{cfg.ab_small:,} synthetic tasks cloned from the same templates ("small"), and a second, identical '
        "`mcp-celery serve -A bench.bench_jobs --http` process is started over it (no worker; tasks/get only "
        f"reads). Then {cfg.ab_rounds} rounds of one {cfg.ab_slice:g} s slice per side (order alternating A B / "
        "B A, after one unrecorded warm-up round; one keep-alive client per server; c=1; a random synthetic id "
        "per request, every answer checked to be `completed`; the first 3 requests of each slice not recorded). "
        "Samples are pooled per side; the figure is p50(big) / p50(small), with a 95% CI from 400 bootstrap "
        "resamples of whole rounds (paired). Met if the ratio is within 1 ± 0.10. Differences between the two "
        "sides besides the store size: the big Redis also carries the idle Celery worker's polling and its "
        "server has served the earlier windows. The sequential before/after windows and the Redis-level reads "
        "are kept as supporting rows.",
        "",
    ]
    tpl = R.get("ours.fill.templates")
    if tpl:
        out += (
            ["Records cloned per synthetic task (ours):", ""]
            + [f"- {t}" for t in tpl]
            + [
                f"- fill: {R.get('ours.fill.n', 0):,} tasks in {f('ours.fill.secs', '{:.1f}')} s (then "
                f"{f('ours.fill.settle_s', '{:.1f}')} s until Redis finished rehashing), "
                f"{f('ours.fill.mem_per_task', '{:.0f}')} B used_memory per synthetic task; a synthetic id's "
                f"tasks/get status: {R.get('ours.fill.synthetic_status')}",
                "",
            ]
        )
    out += [
        "## Results",
        "",
        table(),
        "",
        "## Ratios",
        "",
        ratios(),
        "",
        "## Goals",
        "",
        "| goal | status | figure |",
        "|---|---|---|",
    ]
    out += [f"| {a} | {b} | {c} |" for a, b, c in goals()]
    out += ["", "## Redis command breakdown (per job / per tasks/get)", ""]
    for tag in ("raw", "ours", "fastmcp"):
        if R.get(f"{tag}.cmds_breakdown"):
            out.append(f"- {tag} per job: {R[f'{tag}.cmds_breakdown']}")
        if R.get(f"{tag}.get_breakdown"):
            out.append(f"- {tag} per tasks/get: {R[f'{tag}.get_breakdown']}")
        if R.get(f"{tag}.sync_breakdown"):
            out.append(
                f"- {tag} per sync-path call: {R[f'{tag}.sync_breakdown']}, "
                f"{R[f'{tag}.sync_conns']:.2f} new Redis connections"
            )
    for tag in ("ours", "fastmcp"):
        if R.get(f"{tag}.handle_example"):
            out.append(f"- {tag} task handle example: `{R[f'{tag}.handle_example']}`")
    busy = [(w, x) for w, x in FOREIGN if x >= 0.10]
    out += [
        "",
        "## Validity: CPU used by other processes during each window",
        "",
        "Share of the machine's total CPU capacity used by processes that are not the bench's own (the cores "
        "are shared); windows at 10% or more are suspect.",
        "",
        ", ".join(f"{w} {x:.0%}" for w, x in FOREIGN) or "n/a",
        "",
    ]
    out.append(
        f"**{len(busy)} of {len(FOREIGN)} windows had ≥10% foreign CPU**: " + ", ".join(f"{w} {x:.0%}" for w, x in busy)
        if busy
        else "No window had ≥10% foreign CPU."
    )
    if NOTES:
        out += ["", "## Notes", ""] + [f"- {n}" for n in NOTES]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------- main
PHASES = ("ceiling", "floor", "raw", "ours", "fastmcp")


async def amain(cfg: Cfg, skip: set[str]) -> None:
    rds = BenchRedis()
    rds.start()
    os.environ["BENCH_REDIS_URL"] = rds.url
    say(f"Redis {rds.version()} on port {rds.port} (pid {rds.proc.pid if rds.proc else '?'})")
    machine_info(rds.version())
    R["ours.n_mem"] = cfg.n_mem
    try:
        for name in PHASES:
            if name in skip:
                continue
            say(f"phase {name}")
            t0 = time.monotonic()
            try:
                if name == "ceiling":
                    await phase_ceiling(cfg)
                elif name == "floor":
                    await phase_floor(cfg)
                elif name == "raw":
                    rds.flush()
                    await asyncio.to_thread(phase_raw_celery, cfg, rds)
                elif name == "ours":
                    rds.flush()
                    await phase_ours(cfg, rds)
                elif name == "fastmcp":
                    rds.flush()
                    await phase_fastmcp(cfg, rds)
            except Exception as e:  # noqa: BLE001
                NOTES.append(f"phase {name} failed: {e!r}")
                say(f"  phase {name} FAILED: {e!r}\n{traceback.format_exc()}")
            say(f"  phase {name} took {time.monotonic() - t0:.0f}s")
    finally:
        rds.stop()


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench")
    ap.add_argument("--quick", action="store_true", help="small counts, < 2 minutes")
    ap.add_argument("--skip", nargs="*", default=[], choices=PHASES)
    ap.add_argument("--out", default=str(BENCH / "results.md"))
    a = ap.parse_args()
    cfg = make_cfg(a.quick)
    started = time.time()
    cmdline = "python -m bench" + (" --quick" if a.quick else "") + (f" --skip {' '.join(a.skip)}" if a.skip else "")
    asyncio.run(amain(cfg, set(a.skip)))
    text = report(cfg, started, cmdline)
    print()
    print(table())
    print()
    for g_ in goals():
        print(f"{g_[1]:7s} {g_[0]}: {g_[2]}")
    Path(a.out).write_text(text)
    print(f"\nwrote {a.out} ({time.time() - started:.0f} s)")


if __name__ == "__main__":
    main()
