"""`python -m bench.bookkeeping` measures the pieces it names: each piece reads what the one before
wrote (a job start finds the server's record, a read finds the job's outcome, the celery floor's
read finds Celery's result), and the tool stops on the first that does not."""

from __future__ import annotations

import re
import subprocess
import sys

PIECES = (
    "server: record write",
    "worker: job start",
    "worker: job end",
    "worker, reference: Celery's result write",
    "worker, reference: one GET",
    "server: read and view",
    "server, reference: the celery floor's read",
    "server, reference: one GET",
)


def test_every_piece_runs_over_real_records_and_reports_its_cpu() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "bench.bookkeeping", "--jobs", "200", "--rounds", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    rows = dict(re.findall(r"^\| (.+?) \| (\d+ \| \d+ \| \d+) \|$", run.stdout, re.MULTILINE))
    assert set(rows) == set(PIECES), run.stdout
    for piece, figures in rows.items():
        caller, _redis, both = (int(x) for x in figures.split(" | "))
        assert 0 < caller <= both, (piece, figures)  # every piece costs its caller something
