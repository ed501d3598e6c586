"""Stored-task scaling (ours): tasks/get with ~1,000 stored tasks, after a fill to `fill_to`, and after.

The records of one real finished task are discovered and cloned server-side (`bench/fill.py`); tasks/get
is re-measured on the same real ids and on synthetic ids, the interleaved A/B (`phases/ab.py`) gives the
verdict, then the synthetic tasks are deleted and tasks/get is measured once more.
"""

from __future__ import annotations

import random
import time
import traceback

from bench import fill, rpc
from bench.config import say
from bench.load import percentile_ms, run_load
from bench.phases.ab import scaling_ab
from bench.phases.task_server import Target
from bench.redis_tools import BenchRedis, keys_stored, used_memory
from bench.results import ScalingFigures
from bench.task_ops import all_completed, get_op


def redis_read_us(rds: BenchRedis, templates: list[fill.Template], ids: list[str], n: int = 3000) -> float:
    """Redis-level p50 (µs) of one pipelined read of a task's per-task keys, from a sync client."""
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
    return percentile_ms(lat, 50) * 1000


async def fill_and_measure(t: Target, sample: list[str]) -> None:
    """The whole scaling sequence; its figures go to `t.figures.scaling`."""
    s = t.figures.scaling = ScalingFigures()
    templates = discover(t, sample, s)
    if not templates:
        t.results.notes.append(f"{t.tag}: no task records found for the fill")
        return
    done = await all_completed(t.url, sample)
    if done != len(sample):
        t.results.notes.append(f"{t.tag}: {len(sample) - done} sample tasks not completed before the fill")
    n_fill = top_up(t, sample, templates, s)
    await windows_on_big_store(t, sample, n_fill, s)
    try:
        await scaling_ab(t, sample[0], templates, max(1, n_fill))
    except Exception as e:  # noqa: BLE001  (the A/B is one figure; the rest of the phase still counts)
        t.results.notes.append(f"{t.tag}: interleaved scaling A/B failed: {e!r}")
        say(f"  {t.tag} interleaved scaling A/B FAILED: {e!r}\n{traceback.format_exc()}")
    s.redis_read_1m_after_us = redis_read_us(t.rds, templates, sample)
    secs = fill.fill("127.0.0.1", t.rds.port, sample[0], templates, n_fill, deadline_s=300, delete=True)
    say(f"  {t.tag} deleted the {n_fill} synthetic tasks in {secs:.1f}s")
    res = await run_load(get_op(t.url, sample), 1, duration=t.cfg.window_s, warmup=t.cfg.warmup_s)
    s.get_1k_after_c1 = t.results.window(f"{t.tag}.get1k_after.c1", res)


def discover(t: Target, sample: list[str], s: ScalingFigures) -> list[fill.Template]:
    """The records of one real finished task, their MEMORY USAGE, and a Redis-level read at ~1k stored."""
    templates = fill.discover("127.0.0.1", t.rds.port, sample[0])
    s.redis_read_1k_us = redis_read_us(t.rds, templates, sample)
    s.templates = [tpl.describe(sample[0].encode()) for tpl in templates]
    mem_one = 0
    for tpl in templates:
        if not tpl.index:
            key = tpl.key.replace(fill.PH, sample[0].encode())
            mem_one += int(t.rds.client(tpl.db).memory_usage(key) or 0)
    s.mem_usage_one_task_bytes = mem_one
    say(f"  {t.tag} records of one finished task: " + "; ".join(s.templates) + f"; MEMORY USAGE sum {mem_one} B")
    return templates


def top_up(t: Target, sample: list[str], templates: list[fill.Template], s: ScalingFigures) -> int:
    """Clone synthetic tasks until `fill_to` are stored (the earlier windows created the real ones)."""
    r = t.redis
    per_task = [tpl for tpl in templates if not tpl.index][0]
    pattern = per_task.key.replace(fill.PH, b"*")
    s.real_tasks_stored = real = sum(1 for _ in t.rds.client(per_task.db).scan_iter(match=pattern, count=5000))
    n_fill = max(0, t.cfg.fill_to - real)
    stored_before, m0 = keys_stored(r), used_memory(r)
    secs = fill.fill("127.0.0.1", t.rds.port, sample[0], templates, n_fill, deadline_s=400)
    m1 = used_memory(r)
    s.fill_tasks, s.fill_s = n_fill, secs
    s.fill_mem_per_task_bytes = (m1 - m0) / max(1, n_fill)
    s.settle_s = t.rds.settle()
    s.redis_read_1m_us = redis_read_us(t.rds, templates, sample)
    say(
        f"  {t.tag} filled {n_fill} synthetic tasks in {secs:.1f}s ({stored_before} -> {keys_stored(r)} keys, "
        f"{s.fill_mem_per_task_bytes:.0f} B/task)"
    )
    s.stored_total = real + n_fill
    return n_fill


async def windows_on_big_store(t: Target, sample: list[str], n_fill: int, s: ScalingFigures) -> None:
    """A synthetic id is served; tasks/get c=1 on the real ids, then on random synthetic ids."""
    async with rpc.new_client() as c:
        g = await rpc.tasks_get(c, t.url, fill.synthetic_id(sample[0], 12345 % max(1, n_fill) + 1))
        s.synthetic_status = g.get("status")
    res = await run_load(get_op(t.url, sample), 1, duration=t.cfg.window_s, warmup=t.cfg.warmup_s)
    s.get_1m_c1 = t.results.window(f"{t.tag}.get1m.c1", res)
    ids = [fill.synthetic_id(sample[0], random.randint(1, max(1, n_fill))) for _ in range(2000)]
    res = await run_load(get_op(t.url, ids), 1, duration=t.cfg.window_s, warmup=t.cfg.warmup_s)
    s.get_1m_synthetic_c1 = t.results.window(f"{t.tag}.get1m_synth.c1", res)
