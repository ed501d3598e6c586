"""`python -m bench.artifact_download --quick` runs every side over real processes: a worker and a server
per store, the job's artifact downloaded by curl and by the Python client, each copy checked against the
download's `Repr-Digest` (the tool stops on the first that does not match), and the references beside."""

from __future__ import annotations

import re
import subprocess
import sys

SIDES = {
    "redis": {"ours, curl -o", "ours, Python client", "reference: `redis-cli --raw GET key > file`"},
    "file": {
        "ours, curl -o",
        "ours, Python client",
        "reference: `cp` (same file system)",
        "sendfile server, curl -o",
        "sendfile server, Python client",
    },
}


def test_every_side_of_both_stores_copies_the_artifact_and_is_timed() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "bench.artifact_download", "--quick"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stderr
    rows = re.findall(r"^\| (redis|file) \| (.+?) \| ([\d,]+) \| ", run.stdout, re.MULTILINE)
    found: dict[str, set[str]] = {}
    for store, side, mb_s in rows:
        found.setdefault(store, set()).add(side)
        assert int(mb_s.replace(",", "")) > 0, (store, side)
    assert found == SIDES, run.stdout
