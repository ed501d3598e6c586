"""Every figure one run measures, as typed objects: one dataclass per phase, units in the field names.

A field stays None until its phase measured it, so a phase that fails half way still reports what it
got, and the report prints "n/a" for the rest. Latencies are milliseconds (`_ms`), or microseconds
(`_us`) where stated; rates are per second; shares are fractions of 1.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.config import RunConfig, say
from bench.load import LoadResult, percentile_ms

PACKAGES = ("mcp", "celery", "kombu", "redis", "uvicorn", "starlette", "httpx", "mcp-celery")


@dataclass(frozen=True)
class Window:
    """One recorded load window."""

    p50_ms: float
    p95_ms: float
    rate_per_s: float
    count: int
    errors: int
    foreign_cpu_share: float  # CPU share used meanwhile by processes that are not the bench's

    @classmethod
    def of(cls, res: LoadResult) -> Window:
        return cls(res.p50, res.p95, res.rate, res.n, res.errors, res.foreign_cpu)


@dataclass
class Machine:
    cpu: str
    cores: int | None
    memory: str
    python: str
    redis_server: str
    os: str
    packages: dict[str, str]

    @classmethod
    def collect(cls, redis_version: str) -> Machine:
        return cls(
            cpu=_proc_field("/proc/cpuinfo", "model name"),
            cores=os.cpu_count(),
            memory=_memory(),
            python=platform.python_version(),
            redis_server=redis_version,
            os=platform.platform(),
            packages={pkg: _version(pkg) for pkg in PACKAGES},
        )


def _proc_field(path: str, name: str) -> str:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(name):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def _memory() -> str:
    total = _proc_field("/proc/meminfo", "MemTotal")
    return "?" if total == "?" else f"{int(total.split()[0]) / 1024 / 1024:.1f} GiB"


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "-"


@dataclass
class CeilingFigures:
    """The load client against a raw ASGI app: the client's own limit."""

    c1: Window | None = None
    c16: Window | None = None


@dataclass
class FloorFigures:
    """A minimal mcp lowlevel server: constant tools/call, empty tasks/get."""

    call_c1: Window | None = None
    call_c16: Window | None = None
    get_c1: Window | None = None
    get_c16: Window | None = None


@dataclass
class RawFigures:
    """Plain Celery on the same app configuration."""

    app_config: str | None = None
    idle_cmds_per_s: float | None = None
    apply_p50_ms: float | None = None
    apply_p95_ms: float | None = None
    roundtrip_p50_ms: float | None = None  # delay().get()
    roundtrip_p95_ms: float | None = None
    cmds_per_task: float | None = None  # idle-corrected
    cmds_per_task_uncorrected: float | None = None
    cmds_breakdown: str = ""
    mem_per_task_bytes: float | None = None
    e2e_tasks_per_s: float | None = None  # publish N, then get all
    publish_msgs_per_s: float | None = None
    state_reads_per_s: float | None = None  # AsyncResult(id).state, one thread
    cmds_per_state_read: float | None = None


@dataclass
class ABFigures:
    """Interleaved tasks/get c=1 on a big store and a small one (the stored-task scaling verdict)."""

    big_p50_ms: float
    small_p50_ms: float
    big_samples: int
    small_samples: int
    ratio: float  # big / small
    ci_low: float  # 95% paired-round bootstrap
    ci_high: float
    big_round_p50s_ms: list[float]
    small_round_p50s_ms: list[float]
    round_ratios: list[float]
    rounds: int
    small_stored: int = 0
    slice_s: float = 0.0
    small_keys: int = 0
    foreign_cpu_share: float = 0.0


@dataclass
class MetricsCostFigures:
    """The same server with metrics on and off, interleaved c=1 slices (`ab_stats`: "big" is on, "small" off)."""

    get: ABFigures
    call: ABFigures  # tools/call to the handle, the job worker paused
    get_control: ABFigures  # a second metrics-on server / the first: two identical servers
    call_control: ABFigures
    rounds: int
    slice_s: float
    call_code_us: float  # CPU the metrics code itself takes per tools/call, timed in-process
    get_code_us: float  # the same per tasks/get


@dataclass
class FallbackCostFigures:
    """Synchronous tools/call with the plain-host fallback on and off, interleaved c=1 slices ("big" is on)."""

    sync: ABFigures
    sync_control: ABFigures  # a second fallback-on server / the first: two identical servers
    rounds: int
    slice_s: float


@dataclass
class IdempotencyCostFigures:
    """tools/call-to-handle with a fresh idempotency key per call against without one, on one server ("big" is
    with a key), interleaved c=1 slices."""

    keyed: ABFigures
    control: ABFigures  # calls without a key, a second side, against the first: the slices' own spread
    rounds: int
    slice_s: float


@dataclass
class ScalingFigures:
    """tasks/get before, during and after a fill to `RunConfig.fill_to` stored tasks (ours only)."""

    templates: list[str] = field(default_factory=list)  # the records cloned per synthetic task
    redis_read_1k_us: float | None = None  # pipelined read of one task's records, sync client
    mem_usage_one_task_bytes: int | None = None  # MEMORY USAGE summed over one task's keys
    real_tasks_stored: int | None = None
    fill_tasks: int | None = None
    fill_s: float | None = None
    fill_mem_per_task_bytes: float | None = None
    settle_s: float | None = None  # until Redis finished rehashing after the fill
    redis_read_1m_us: float | None = None
    synthetic_status: str | None = None  # a synthetic id's tasks/get status
    get_1m_c1: Window | None = None  # real ids
    get_1m_synthetic_c1: Window | None = None
    stored_total: int | None = None
    ab: ABFigures | None = None
    redis_read_1m_after_us: float | None = None  # after the load windows on the big store
    get_1k_after_c1: Window | None = None  # after deleting the synthetic tasks


@dataclass
class TaskServerFigures:
    """A SEP-2663 task server (ours or FastMCP) with its worker, on the bench Redis."""

    handle_example: dict[str, Any] | None = None
    idle_cmds_per_s: float | None = None
    idle_reads_per_s: float | None = None
    tasks_in_memory_window: int | None = None
    cmds_per_task: float | None = None  # tools/call + job, idle-corrected
    cmds_per_task_uncorrected: float | None = None
    cmds_breakdown: str = ""
    mem_per_task_bytes: float | None = None
    keys_after_memory_window: int | None = None
    get_c1: Window | None = None  # with ~1,000 stored tasks
    cmds_per_get: float | None = None
    cmds_per_get_uncorrected: float | None = None
    get_breakdown: str = ""
    round_trips_per_get: float | None = None
    scaling: ScalingFigures | None = None
    get_c16: Window | None = None
    call_c1: Window | None = None
    call_c16: Window | None = None
    call_c16_alone: Window | None = None  # the job worker paused (SIGSTOP) during the window
    e2e_c16: Window | None = None
    sync_c1: Window | None = None
    sync_cmds_per_call: float | None = None
    sync_new_conns_per_call: float | None = None
    sync_breakdown: str = ""


@dataclass(frozen=True)
class Latencies:
    """Round trips timed one at a time (not a load window)."""

    p50_ms: float
    p95_ms: float
    max_ms: float
    count: int

    @classmethod
    def of(cls, seconds: list[float]) -> Latencies:
        return cls(percentile_ms(seconds, 50), percentile_ms(seconds, 95), max(seconds) * 1000, len(seconds))


@dataclass
class CancelFigures:
    """From sending `tasks/cancel` until the job stopped (its Celery state REVOKED), one task at a time, and
    the reference timed in the same rounds: `tasks/update` until a job waiting for input carries on."""

    input_continues: Latencies | None = None  # the reference: the same wake-up (the job's BLPOP on its bell)
    waiting: Latencies | None = None  # a job waiting for input (`ask_one`)
    running: Latencies | None = None  # a running job with a checkpoint every checkpoint_ms (`spin`)
    parked: Latencies | None = None  # a job parked at its question (`ask_parking`): the server ends it
    checkpoint_ms: float | None = None


@dataclass
class Results:
    """Everything one run measured, plus the CPU-share record of every window and the notes."""

    config: RunConfig
    machine: Machine | None = None
    ceiling: CeilingFigures = field(default_factory=CeilingFigures)
    floor: FloorFigures = field(default_factory=FloorFigures)
    #: The floor plus one Redis round trip per request: the least any Redis-backed server pays.
    floor_redis: FloorFigures = field(default_factory=FloorFigures)
    raw: RawFigures = field(default_factory=RawFigures)
    ours: TaskServerFigures = field(default_factory=TaskServerFigures)
    fastmcp: TaskServerFigures = field(default_factory=TaskServerFigures)
    cancel: CancelFigures = field(default_factory=CancelFigures)
    metrics: MetricsCostFigures | None = None
    fallback: FallbackCostFigures | None = None
    idempotency: IdempotencyCostFigures | None = None
    foreign_cpu: list[tuple[str, float]] = field(default_factory=list)  # (window, share), in run order
    notes: list[str] = field(default_factory=list)

    def window(self, name: str, res: LoadResult) -> Window:
        """Record one load window: its CPU share for the validity section, its errors as a note."""
        self.foreign_cpu.append((name, res.foreign_cpu))
        say(f"  {name}: {res.summary()}")
        if res.errors:
            self.notes.append(f"{name}: {res.errors} errors, first: {res.first_error[:300]}")
        return Window.of(res)
