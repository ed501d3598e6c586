"""README command 1: `mcp-celery demo` on a machine with no Redis configured or answering."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support import ROOT, free_port


def test_the_demo_starts_an_embedded_redis_and_walks_through_every_feature() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERY_")}
    env["MCP_CELERY_DEMO_REDIS"] = f"redis://127.0.0.1:{free_port()}"  # nothing listens there
    out = subprocess.run(
        [sys.executable, "-m", "mcp_celery", "demo", "--port", str(free_port())],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "started an embedded one" in out.stdout
    for line in ("result: demo done after 2 s", "'published': True", "cancelled by client", "result: 6 words"):
        assert line in out.stdout, out.stdout
