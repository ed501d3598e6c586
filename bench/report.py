"""bench/results.md: machine, method, results, ratios, goals, Redis command breakdown, validity, notes."""

from __future__ import annotations

import time
from pathlib import Path

from bench.config import CANCEL_CHECKPOINT_S, POLL_INTERVAL_S, RunConfig
from bench.goals import Goal, issue14_goals
from bench.results import PACKAGES, ABFigures, Results, ScalingFigures, TaskServerFigures
from bench.table import fmt, ratios_table, results_table

SUSPECT_FOREIGN_CPU = 0.10  # windows where other processes used this share of the machine or more


def machine_section(r: Results) -> list[str]:
    m = r.machine
    if m is None:
        return ["## Machine", "", "- not recorded", ""]
    return [
        "## Machine",
        "",
        f"- CPU: {m.cpu} × {m.cores} cores; memory {m.memory}; {m.os}",
        f"- Python {m.python}; Redis server {m.redis_server} (private instance on a spare loopback port, "
        "no persistence)",
        "- packages: " + ", ".join(f"{k} {m.packages.get(k)}" for k in PACKAGES),
        "- FastMCP baseline: fastmcp 4.1.4 + fastmcp-tasks 4.1.4 (pydocket) in bench/.venv-fastmcp",
        "- Everything (load client, servers, Celery worker prefork -c 2, Redis) shares the same cores.",
        "",
    ]


def method_section(cfg: RunConfig, app_config: str | None) -> list[str]:
    return [
        "## Method",
        "",
        "- Load client: asyncio, one `httpx.AsyncClient` (1 keep-alive connection) per concurrent worker, closed "
        "loop; raw JSON-RPC 2026-07-28 POSTs with the `_meta` envelope (tasks extension declared, or `{}` "
        "capabilities for the sync path) and `MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name` headers.",
        f"- Each load window: {cfg.warmup_s:g} s warm-up, then {cfg.window_s:g} s recorded (counts where stated).",
        "- Floor: mcp lowlevel `Server`, constant `CallToolResult` and an empty custom `tasks/get` handler, "
        "`streamable_http_app(stateless_http=True, json_response=True)` on uvicorn (same uvicorn defaults as "
        "the servers under test). Client ceiling: raw ASGI app returning a fixed JSON body on uvicorn.",
        "- Celery worker for raw Celery and ours: `celery -A bench.bench_jobs worker -P prefork -c 2 "
        f"--without-gossip --without-mingle -l WARNING`; app config: {app_config}.",
        "- e2e for MCP servers: each of 16 workers creates a task then polls `tasks/get` every "
        f"{POLL_INTERVAL_S * 1000:g} ms until `completed`; raw Celery: publish N with `apply_async`, then "
        "`.get()` all.",
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
        f'{cfg.ab_small_store:,} synthetic tasks cloned from the same templates ("small"), and a second, identical '
        "`mcp-celery serve -A bench.bench_jobs --http` process is started over it (no worker; tasks/get only "
        f"reads). Then {cfg.ab_rounds} rounds of one {cfg.ab_slice_s:g} s slice per side (order alternating A B / "
        "B A, after one unrecorded warm-up round; one keep-alive client per server; c=1; a random synthetic id "
        "per request, every answer checked to be `completed`; the first 3 requests of each slice not recorded). "
        "Samples are pooled per side; the figure is p50(big) / p50(small), with a 95% CI from 400 bootstrap "
        "resamples of whole rounds (paired). Met if the ratio is within 1 ± 0.10. Differences between the two "
        "sides besides the store size: the big Redis also carries the idle Celery worker's polling and its "
        "server has served the earlier windows. The sequential before/after windows and the Redis-level reads "
        "are kept as supporting rows.",
        f"- Cancel ({cfg.cancel_rounds} rounds, one task at a time, own prefork worker -c 4 and server): each round "
        "times `tasks/update` until a job waiting for input (`ask_one`) carries on (the reference: the same "
        "wake-up), then `tasks/cancel` until a waiting job stops, then until a running job (`spin`, one cancel "
        f"checkpoint every {CANCEL_CHECKPOINT_S * 1000:g} ms, as the log search's tick) stops, cancelled at a random "
        "point of that cycle, then until a job parked at its question (`ask_parking`, no worker holds it) reads "
        "REVOKED, which the server writes itself. From the request being sent (from a second "
        "thread) to the end of the first GET of the job's Celery result, in a tight loop meanwhile, that finds "
        "REVOKED; each cancelled task must end `cancelled` by its job, not by the grace period.",
        "",
    ]


def fill_section(s: ScalingFigures | None) -> list[str]:
    if s is None or not s.templates:
        return []
    return [
        "Records cloned per synthetic task (ours):",
        "",
        *[f"- {t}" for t in s.templates],
        f"- fill: {s.fill_tasks or 0:,} tasks in {fmt(s.fill_s, '{:.1f}')} s (then "
        f"{fmt(s.settle_s, '{:.1f}')} s until Redis finished rehashing), "
        f"{fmt(s.fill_mem_per_task_bytes, '{:.0f}')} B used_memory per synthetic task; a synthetic id's "
        f"tasks/get status: {s.synthetic_status}",
        "",
    ]


def breakdown_section(r: Results) -> list[str]:
    out = ["## Redis command breakdown (per job / per tasks/get)", ""]
    if r.raw.cmds_breakdown:
        out.append(f"- raw per job: {r.raw.cmds_breakdown}")
    servers: list[tuple[str, TaskServerFigures]] = [("ours", r.ours), ("fastmcp", r.fastmcp)]
    for tag, f in servers:
        if f.cmds_breakdown:
            out.append(f"- {tag} per job: {f.cmds_breakdown}")
        if f.get_breakdown:
            out.append(f"- {tag} per tasks/get: {f.get_breakdown}")
        if f.sync_breakdown:
            out.append(
                f"- {tag} per sync-path call: {f.sync_breakdown}, "
                f"{fmt(f.sync_new_conns_per_call)} new Redis connections"
            )
    out += [f"- {tag} task handle example: `{f.handle_example}`" for tag, f in servers if f.handle_example]
    return out


def validity_section(r: Results) -> list[str]:
    busy = [(w, x) for w, x in r.foreign_cpu if x >= SUSPECT_FOREIGN_CPU]
    verdict = (
        f"**{len(busy)} of {len(r.foreign_cpu)} windows had ≥10% foreign CPU**: "
        + ", ".join(f"{w} {x:.0%}" for w, x in busy)
        if busy
        else "No window had ≥10% foreign CPU."
    )
    return [
        "## Validity: CPU used by other processes during each window",
        "",
        "Share of the machine's total CPU capacity used by processes that are not the bench's own (the cores "
        "are shared); windows at 10% or more are suspect.",
        "",
        ", ".join(f"{w} {x:.0%}" for w, x in r.foreign_cpu) or "n/a",
        "",
        verdict,
    ]


#: Hand-written analysis (profiles, before/after of each change that mattered), kept in every report.
ANALYSIS = Path(__file__).resolve().parent / "where-the-time-went.md"
PUSH = Path(__file__).resolve().parent / "results-push.md"


def metrics_section(r: Results) -> list[str]:
    """The cost of the server's own Prometheus metrics (the `metrics` phase)."""
    m = r.metrics
    if m is None:
        return []
    rows = [
        f"| {name} | {ab.big_p50_ms:.3f} | {ab.small_p50_ms:.3f} | {ab.ratio:.3f}× ({ab.ci_low:.3f}–{ab.ci_high:.3f}×) "
        f"| {aa.ratio:.3f}× ({aa.ci_low:.3f}–{aa.ci_high:.3f}×) | {ab.big_samples} / {ab.small_samples} |"
        for name, ab, aa in (
            ("tools/call→handle (job worker paused)", m.call, m.call_control),
            ("tasks/get", m.get, m.get_control),
        )
    ]
    return [
        "",
        "### Metrics cost",
        "",
        "Three `mcp-celery serve` processes over the bench Redis, identical but for MCP_CELERY_METRICS=false on "
        f"one, measured in alternating c=1 slices ({m.rounds} rounds × {m.slice_s:g} s per side, after a warm-up "
        "round); the third, metrics on too, is a control (what two identical servers differ by here). "
        "Ratio: p50 on / off, 95% CI from a paired-round bootstrap. Beside it, drift-free: the CPU "
        "time of the metrics code itself per request, timed in-process around a handler that does nothing: "
        f"tools/call {m.call_code_us:.2f} µs ({m.call_code_us / 1000 / m.call.small_p50_ms:.2%} of the off p50), "
        f"tasks/get {m.get_code_us:.2f} µs ({m.get_code_us / 1000 / m.get.small_p50_ms:.2%}).",
        "",
        "| request | metrics on p50 ms | off p50 ms | on / off (95% CI) | control: a second on server / on | "
        "samples on / off |",
        "|---|---|---|---|---|---|",
        *rows,
    ]


def fallback_section(r: Results) -> list[str]:
    """The synchronous path with the plain-host fallback on and off (the `fallback` phase)."""
    f = r.fallback
    if f is None:
        return []
    intro = (
        "Three `mcp-celery serve` processes over the bench Redis and one prefork worker, identical but for "
        "MCP_CELERY_TOOL_FALLBACK=false on one, measured in alternating c=1 slices of synchronous `tools/call` "
        f"(no extension declared) of a trivial job ({f.rounds} rounds × {f.slice_s:g} s per side, after a warm-up "
        "round); the third, fallback on too, is a control. Ratio: p50 on / off, 95% CI from a paired-round bootstrap."
    )
    columns = ("fallback on p50 ms", "off p50 ms", "on / off", "control: a second on server / on", "on / off")
    return _interleaved_table(
        "Plain-host fallback cost", intro, columns, "synchronous tools/call, trivial job", f.sync, f.sync_control
    )


def idempotency_section(r: Results) -> list[str]:
    """tools/call with an idempotency key against without one (the `idempotency` phase)."""
    f = r.idempotency
    if f is None:
        return []
    intro = (
        "One `mcp-celery serve` over the bench Redis (its prefork worker paused, so that no job shares the "
        "slices), measured in alternating c=1 slices of `tools/call`-to-handle of a trivial job with a fresh "
        f"`Idempotency-Key` per call and without one ({f.rounds} rounds × {f.slice_s:g} s per side, after a "
        "warm-up round); a second side without a key is the control. Ratio: p50 with / without, 95% CI from a "
        "paired-round bootstrap."
    )
    columns = ("with a key p50 ms", "without p50 ms", "with / without", "control: without / without", "with / without")
    return _interleaved_table(
        "Idempotency keys' cost", intro, columns, "tools/call to the task handle, trivial job", f.keyed, f.control
    )


def _interleaved_table(
    title: str, intro: str, columns: tuple[str, ...], request: str, ab: ABFigures, aa: ABFigures
) -> list[str]:
    """A section of one interleaved A/B: its heading, how it was run, and one row (both p50s, the ratio and
    its 95% CI, the control's, the samples). `columns`: the two p50s, the ratio, the control, the samples' sides."""
    big, small, ratio, control, sides = columns
    return [
        "",
        f"### {title}",
        "",
        intro,
        "",
        f"| request | {big} | {small} | {ratio} (95% CI) | {control} | samples {sides} |",
        "|---|---|---|---|---|---|",
        f"| {request} | {ab.big_p50_ms:.3f} | {ab.small_p50_ms:.3f} | {ab.ratio:.3f}× "
        f"({ab.ci_low:.3f}–{ab.ci_high:.3f}×) | {aa.ratio:.3f}× ({aa.ci_low:.3f}–{aa.ci_high:.3f}×) "
        f"| {ab.big_samples} / {ab.small_samples} |",
    ]


def analysis_section() -> list[str]:
    """A pointer, not a copy: each figure lives in one place (the analysis keeps its own runs' figures)."""
    if not ANALYSIS.exists():
        return []
    return [
        "",
        "## Where the time went",
        "",
        f"Profiles, and the before and after of each change that mattered: [{ANALYSIS.name}]({ANALYSIS.name}).",
    ]


def push_section() -> list[str]:
    """A pointer to the latest `python -m bench.push` run (its own command and page)."""
    if not PUSH.exists():
        return []
    return ["", "## Push against polling", "", f"The latest `python -m bench.push` run: [{PUSH.name}]({PUSH.name})."]


def render(r: Results, goals: list[Goal], started: float, cmdline: str) -> str:
    """The whole of bench/results.md."""
    out = [
        f"# mcp-celery benchmark results ({'quick' if r.config.quick else 'full'} run)",
        "",
        f"Generated by `{cmdline}` on {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, wall time "
        f"{time.time() - started:.0f} s.",
        "",
        *machine_section(r),
        *method_section(r.config, r.raw.app_config),
        *fill_section(r.ours.scaling),
        "## Results",
        "",
        results_table(r),
        "",
        "## Ratios",
        "",
        ratios_table(r),
        "",
        "## Goals",
        "",
        "| goal | status | figure |",
        "|---|---|---|",
        *[f"| {g.description} | {g.status} | {g.figure} |" for g in goals],
        "",
        "### Issue 14: task creation and the synchronous path",
        "",
        "The last column is the same ratio for the floor plus one Redis round trip per request",
        "(`bench/floor_server.py` with Redis: a task-sized pipelined write, a task-sized HGETALL):",
        "what any server that keeps its tasks in Redis pays before doing any work of its own.",
        "",
        "| goal | status | figure | floor + one Redis round trip |",
        "|---|---|---|---|",
        *[f"| {b.goal.description} | {b.goal.status} | {b.goal.figure} | {b.bound} |" for b in issue14_goals(r)],
        *metrics_section(r),
        *fallback_section(r),
        *idempotency_section(r),
        *analysis_section(),
        *push_section(),
        "",
        *breakdown_section(r),
        "",
        *validity_section(r),
    ]
    if r.notes:
        out += ["", "## Notes", ""] + [f"- {n}" for n in r.notes]
    return "\n".join(out) + "\n"


def summary(r: Results, goals: list[Goal]) -> str:
    """What a run prints when it ends: the results table and one line per goal."""
    lines = ["", results_table(r), ""]
    lines += [f"{g.status:7s} {g.description}: {g.figure}" for g in goals]
    return "\n".join(lines)
