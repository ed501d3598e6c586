"""The plain-host fallback's cost on the synchronous path, alone: `python -m bench.fallback [--quick] [--out FILE]`.

The `fallback` phase of `python -m bench` (`bench/phases/fallback_cost.py`), run by itself and written to
bench/results-fallback.md.
"""

from __future__ import annotations

from bench.alone import run_alone
from bench.goals import fallback_cost
from bench.phases.fallback_cost import run_fallback
from bench.report import fallback_section

if __name__ == "__main__":
    run_alone(
        "python -m bench.fallback",
        "results-fallback.md",
        "The plain-host fallback on the synchronous path",
        run_fallback,
        fallback_section,
        fallback_cost,
    )
