"""The results table and the ratios table of the report (also printed at the end of a run)."""

from __future__ import annotations

import statistics

from bench.results import ABFigures, Latencies, Results, ScalingFigures, Window

Row = tuple[str, str, str, str, str]  # metric, floor / ceiling, ours, raw Celery, FastMCP
HEAD: Row = ("metric", "floor / ceiling", "ours (mcp-celery)", "raw Celery", "FastMCP 4.1.4")


def fmt(value: object, spec: str = "{:.2f}") -> str:
    """A figure as the report prints it; "n/a" when it was not measured."""
    if value is None:
        return "n/a"
    try:
        return spec.format(value)
    except (ValueError, TypeError):
        return str(value)


def p50_p95(w: Window | None) -> str:
    return f"{fmt(w and w.p50_ms)} / {fmt(w and w.p95_ms)}"


def rate(w: Window | None) -> str:
    return fmt(w and w.rate_per_s, "{:.0f}")


def ratio(x: float | None, y: float | None) -> str:
    return "n/a" if x is None or y is None or not y else f"{x / y:.2f}×"


def _p50(w: Window | None) -> float | None:
    return w.p50_ms if w else None


def _rate(w: Window | None) -> float | None:
    return w.rate_per_s if w else None


def baseline_rows(r: Results) -> list[Row]:
    """Load client ceiling, tools/call and tasks/get at c=1 and c=16 on every server."""
    c, fl, ou, fm, raw = r.ceiling, r.floor, r.ours, r.fastmcp, r.raw
    rows: list[Row] = [
        ("client ceiling (raw ASGI) c=1 p50 / p95 ms", p50_p95(c.c1), "", "", ""),
        ("client ceiling c=1 / c=16 req/s", f"{rate(c.c1)} / {rate(c.c16)}", "", "", ""),
    ]
    apply = f"apply_async {fmt(raw.apply_p50_ms)} / {fmt(raw.apply_p95_ms)}"
    publish = f"publish {fmt(raw.publish_msgs_per_s, '{:.0f}')} msg/s"
    calls = ((1, fl.call_c1, ou.call_c1, fm.call_c1), (16, fl.call_c16, ou.call_c16, fm.call_c16))
    for n, floor_w, ours_w, fm_w in calls:
        raw_p50 = apply if n == 1 else ""
        name = f"tools/call→handle c={n} p50 / p95 ms"
        rows.append((name, p50_p95(floor_w), p50_p95(ours_w), raw_p50, p50_p95(fm_w)))
        raw_rate = publish if n == 16 else ""
        rows.append((f"tools/call→handle c={n} calls/s", rate(floor_w), rate(ours_w), raw_rate, rate(fm_w)))
    fr = r.floor_redis
    rows += [
        ("floor + 1 Redis round trip: tools/call c=1 p50 / p95 ms", p50_p95(fr.call_c1), "", "", ""),
        ("floor + 1 Redis round trip: tools/call c=16 calls/s", rate(fr.call_c16), "", "", ""),
        ("floor + 1 Redis round trip: tasks/get c=1 p50 / p95 ms", p50_p95(fr.get_c1), "", "", ""),
        ("floor + 1 Redis round trip: tasks/get c=16 req/s", rate(fr.get_c16), "", "", ""),
    ]
    rows.append(("tools/call→handle c=16 calls/s, job worker paused", "", rate(ou.call_c16_alone), "", ""))
    state = f"AsyncResult.state {fmt(raw.state_reads_per_s, '{:.0f}')}/s (1 thread)"
    gets = ((1, fl.get_c1, ou.get_c1, fm.get_c1), (16, fl.get_c16, ou.get_c16, fm.get_c16))
    for n, floor_w, ours_w, fm_w in gets:
        rows.append((f"tasks/get c={n} p50 / p95 ms", p50_p95(floor_w), p50_p95(ours_w), "", p50_p95(fm_w)))
        rows.append((f"tasks/get c={n} req/s", rate(floor_w), rate(ours_w), state if n == 1 else "", rate(fm_w)))
    return rows


def row(metric: str, floor: str = "", ours: str = "", raw: str = "", fastmcp: str = "") -> Row:
    return (metric, floor, ours, raw, fastmcp)


def job_rows(r: Results) -> list[Row]:
    """End to end, the synchronous path, and the Redis cost per job and per tasks/get."""
    fl, ou, fm, raw = r.floor, r.ours, r.fastmcp, r.raw
    return [
        row(
            "e2e trivial job, tasks/s (MCP: c=16 create+poll; raw: publish N then get all)",
            ours=rate(ou.e2e_c16),
            raw=fmt(raw.e2e_tasks_per_s, "{:.0f}"),
            fastmcp=rate(fm.e2e_c16),
        ),
        row("e2e per-task latency c=16 p50 / p95 ms", ours=p50_p95(ou.e2e_c16), fastmcp=p50_p95(fm.e2e_c16)),
        row(
            "sync path (no extension) c=1 p50 / p95 ms; raw: delay().get()",
            floor=p50_p95(fl.call_c1),
            ours=p50_p95(ou.sync_c1),
            raw=f"{fmt(raw.roundtrip_p50_ms)} / {fmt(raw.roundtrip_p95_ms)}",
            fastmcp=p50_p95(fm.sync_c1),
        ),
        row(
            "Redis cmds per job (create + worker, idle-corrected)",
            ours=fmt(ou.cmds_per_task, "{:.1f}"),
            raw=fmt(raw.cmds_per_task, "{:.1f}"),
            fastmcp=fmt(fm.cmds_per_task, "{:.1f}"),
        ),
        row(
            "Redis cmds per tasks/get (raw: per .state read)",
            ours=fmt(ou.cmds_per_get),
            raw=fmt(raw.cmds_per_state_read),
            fastmcp=fmt(fm.cmds_per_get),
        ),
        row("Redis round trips per tasks/get", ours=fmt(ou.round_trips_per_get), fastmcp=fmt(fm.round_trips_per_get)),
        row(
            "Redis used_memory per finished task, B",
            ours=fmt(ou.mem_per_task_bytes, "{:.0f}"),
            raw=fmt(raw.mem_per_task_bytes, "{:.0f}"),
            fastmcp=fmt(fm.mem_per_task_bytes, "{:.0f}"),
        ),
    ]


def ab_cells(ab: ABFigures | None) -> tuple[str, str]:
    """The A/B verdict (pooled p50s, ratio, CI) and the spread of its per-round figures."""
    spec = "{:.3f}"
    verdict = (
        f"{fmt(ab and ab.big_p50_ms, spec)} / {fmt(ab and ab.small_p50_ms, spec)} = {fmt(ab and ab.ratio, spec)}× "
        f"({fmt(ab and ab.ci_low, spec)}–{fmt(ab and ab.ci_high, spec)}×)"
    )
    if not (ab and ab.big_round_p50s_ms and ab.small_round_p50s_ms and ab.round_ratios):
        return verdict, "n/a"
    rb, rs, rr = ab.big_round_p50s_ms, ab.small_round_p50s_ms, ab.round_ratios
    rounds = (
        f"{min(rb):.2f}–{max(rb):.2f} / {min(rs):.2f}–{max(rs):.2f}; "
        f"{min(rr):.2f}–{statistics.median(rr):.2f}–{max(rr):.2f}"
    )
    return verdict, rounds


def scaling_rows(r: Results) -> list[Row]:
    """Stored-task scaling (ours): the interleaved A/B verdict and its supporting windows."""
    ou = r.ours
    s = ou.scaling or ScalingFigures()
    ab = s.ab
    total = s.stored_total or 0
    real = s.real_tasks_stored if s.real_tasks_stored is not None else 1000
    verdict, rounds = ab_cells(ab)
    us = "{:.0f}"
    return [
        row(
            f"tasks/get c=1 p50 ms, interleaved A/B: {total:,} / {ab.small_stored if ab else 0:,} stored "
            "(big / small = ratio, 95% CI)",
            ours=verdict,
        ),
        row(
            f"  interleaved A/B per-round p50 min–max ms ({ab.rounds if ab else 0} rounds × "
            f"{ab.slice_s if ab else 0:g} s per side): big / small; per-round ratio min–median–max",
            ours=rounds,
        ),
        row(
            f"tasks/get c=1 p50 ms @ ~{real:,} stored (before / after the fill)",
            ours=f"{fmt(_p50(ou.get_c1))} / {fmt(_p50(s.get_1k_after_c1))}",
            fastmcp=fmt(_p50(r.fastmcp.get_c1)),
        ),
        row(
            f"tasks/get c=1 p50 ms @ {total:,} stored (real ids / synthetic ids)",
            ours=f"{fmt(_p50(s.get_1m_c1))} / {fmt(_p50(s.get_1m_synthetic_c1))}",
        ),
        row(
            "Redis-level read of one task (pipelined, sync client) p50 µs @ ~1k / 1M / 1M after the windows",
            ours=f"{fmt(s.redis_read_1k_us, us)} / {fmt(s.redis_read_1m_us, us)} / {fmt(s.redis_read_1m_after_us, us)}",
        ),
        row(
            "sync path: Redis cmds / new Redis connections per call",
            ours=f"{fmt(ou.sync_cmds_per_call, '{:.1f}')} / {fmt(ou.sync_new_conns_per_call)}",
        ),
    ]


def latencies(lat: Latencies | None) -> str:
    return f"{fmt(lat and lat.p50_ms)} / {fmt(lat and lat.p95_ms)} / {fmt(lat and lat.max_ms)}"


def cancel_rows(r: Results) -> list[Row]:
    """The cancel phase: tasks/cancel until the job stopped, and the input round trip of the same rounds."""
    c = r.cancel
    rounds = c.waiting.count if c.waiting else 0
    every = fmt(c.checkpoint_ms, "{:g}")
    return [
        row(
            f"cancel → job stopped p50 / p95 / max ms ({rounds} runs): a job waiting for input",
            ours=latencies(c.waiting),
        ),
        row(
            f"cancel → job stopped p50 / p95 / max ms: a running job, a checkpoint every {every} ms",
            ours=latencies(c.running),
        ),
        row("cancel → Celery's REVOKED p50 / p95 / max ms: a job parked at its question", ours=latencies(c.parked)),
        row(
            "reference, same rounds: tasks/update → waiting job continues p50 / p95 / max ms",
            ours=latencies(c.input_continues),
        ),
    ]


def results_table(r: Results) -> str:
    rows = baseline_rows(r) + job_rows(r) + scaling_rows(r) + cancel_rows(r)
    widths = [max(len(row[i]) for row in [*rows, HEAD]) for i in range(5)]
    lines = [
        "| " + " | ".join(h.ljust(widths[i]) for i, h in enumerate(HEAD)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += ["| " + " | ".join(c.ljust(widths[i]) for i, c in enumerate(row)) + " |" for row in rows]
    return "\n".join(lines)


def ratios_table(r: Results) -> str:
    fl, ou, fm, raw, ce = r.floor, r.ours, r.fastmcp, r.raw, r.ceiling
    items = [
        ("tools/call→handle p50 c=1, ours / floor", ratio(_p50(ou.call_c1), _p50(fl.call_c1))),
        ("tools/call→handle p50 c=1, ours / FastMCP", ratio(_p50(ou.call_c1), _p50(fm.call_c1))),
        ("tools/call→handle p50 c=1, ours / raw apply_async", ratio(_p50(ou.call_c1), raw.apply_p50_ms)),
        ("calls/s c=16, ours / floor", ratio(_rate(ou.call_c16), _rate(fl.call_c16))),
        ("calls/s c=16, ours / FastMCP", ratio(_rate(ou.call_c16), _rate(fm.call_c16))),
        ("tasks/get p50 c=1, ours / floor", ratio(_p50(ou.get_c1), _p50(fl.get_c1))),
        ("tasks/get p50 c=1, ours / FastMCP", ratio(_p50(ou.get_c1), _p50(fm.get_c1))),
        ("tasks/get req/s c=16, ours / floor", ratio(_rate(ou.get_c16), _rate(fl.get_c16))),
        ("tasks/get req/s c=16, ours / FastMCP", ratio(_rate(ou.get_c16), _rate(fm.get_c16))),
        ("tasks/get req/s c=1, ours / raw AsyncResult.state reads/s", ratio(_rate(ou.get_c1), raw.state_reads_per_s)),
        ("e2e tasks/s, ours / raw Celery", ratio(_rate(ou.e2e_c16), raw.e2e_tasks_per_s)),
        ("e2e tasks/s, ours / FastMCP", ratio(_rate(ou.e2e_c16), _rate(fm.e2e_c16))),
        ("sync path p50, ours / floor tools/call", ratio(_p50(ou.sync_c1), _p50(fl.call_c1))),
        ("sync path p50, ours / raw delay().get()", ratio(_p50(ou.sync_c1), raw.roundtrip_p50_ms)),
        ("Redis cmds per job, ours / raw Celery", ratio(ou.cmds_per_task, raw.cmds_per_task)),
        ("Redis cmds per job, ours / FastMCP", ratio(ou.cmds_per_task, fm.cmds_per_task)),
        ("Redis cmds per tasks/get, ours / FastMCP", ratio(ou.cmds_per_get, fm.cmds_per_get)),
        ("floor c=16 req/s / client ceiling c=16", ratio(_rate(fl.call_c16), _rate(ce.c16))),
    ]
    return "\n".join(f"| {a} | {b} |" for a, b in [("ratio", "value"), ("---", "---"), *items])
