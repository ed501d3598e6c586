"""The cost of an idempotency key on `tools/call`, alone: `python -m bench.idempotency [--quick] [--out FILE]`.

The `idempotency` phase of `python -m bench` (`bench/phases/idempotency_cost.py`), run by itself and written to
bench/results-idempotency.md (issue 47: with a key at most 1.1x without, p50, same run).
"""

from __future__ import annotations

from bench.alone import run_alone
from bench.goals import idempotency_cost
from bench.phases.idempotency_cost import run_idempotency
from bench.report import idempotency_section

if __name__ == "__main__":
    run_alone(
        "python -m bench.idempotency",
        "results-idempotency.md",
        "Idempotency keys on `tools/call`",
        run_idempotency,
        idempotency_section,
        idempotency_cost,
    )
