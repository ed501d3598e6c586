"""`python -m tests.support.chaos --minutes 10`: the long chaos run (200 tasks in flight), by hand."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tests.support.chaos import Plan, run_chaos


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.chaos", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the chaos lasts (default 10)")
    parser.add_argument("--tasks", type=int, default=200, help="tasks kept in flight (default 200)")
    parser.add_argument("--concurrency", type=int, default=6, help="pool processes per worker (default 6)")
    parser.add_argument("--seed", type=int, default=None, help="replay the decisions of an earlier run")
    parser.add_argument("--logs", type=Path, default=None, help="folder for Redis and process logs")
    args = parser.parse_args()
    folder = args.logs or Path(tempfile.mkdtemp(prefix="mcp-celery-chaos-"))
    plan = Plan(in_flight=args.tasks, duration_s=args.minutes * 60, concurrency=args.concurrency)
    verdict = run_chaos(folder, plan, args.seed)
    return 1 if verdict.problems or verdict.stuck else 0


if __name__ == "__main__":
    sys.exit(main())
