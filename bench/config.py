"""How big one run is (`--quick` or full), and the progress log every phase writes to."""

from __future__ import annotations

import time
from dataclasses import dataclass

POLL_INTERVAL_S = 0.010  # e2e: sleep between tasks/get polls (same for ours and FastMCP)
#: The cancel phase's running job checks for a cancel this often, as the log search's tick does
#: (jobs/_logsearch.py TICK_S).
CANCEL_CHECKPOINT_S = 0.020


@dataclass(frozen=True)
class RunConfig:
    """Counts and durations of one run; `quick()` and `full()` are the two presets."""

    quick: bool
    window_s: float  # seconds recorded per load window
    warmup_s: float  # seconds of warm-up before each window
    tasks_in_memory_window: int  # tasks created in the commands / memory window
    tasks_in_e2e_window: int  # tasks in the MCP e2e window
    raw_latency_samples: int  # apply_async and delay().get() samples (raw Celery)
    raw_e2e_tasks: int  # tasks published then collected (raw Celery e2e)
    sync_calls: int  # calls in the sync-path window
    gets_for_command_count: int  # sequential tasks/get whose Redis commands are counted
    fill_to: int  # tasks stored after the fill (ours)
    ab_rounds: int  # interleaved scaling A/B: rounds of (one slice on the big store, one on the small one)
    ab_slice_s: float  # seconds per slice
    ab_small_store: int  # tasks stored in the small store
    cancel_rounds: int  # cancel phase: rounds of (an input round trip, a waiting job cancelled, a running one)

    @classmethod
    def for_run(cls, quick: bool) -> RunConfig:
        if quick:
            return cls(True, 1.5, 0.3, 300, 300, 100, 300, 100, 200, 20_000, 20, 0.15, 1000, 10)
        return cls(False, 5.0, 1.0, 1000, 3000, 500, 3000, 500, 1000, 1_000_000, 40, 0.25, 1000, 40)

    @property
    def idle_window_s(self) -> float:
        """How long background Redis traffic is sampled before counting commands."""
        return 1.0 if self.quick else 2.0


def say(msg: str) -> None:
    """A timestamped progress line on stdout."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)
