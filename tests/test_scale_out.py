"""Several server processes serve the same tasks: no task state lives in a server's memory."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import HttpClient, Process, free_port, wait_for


@pytest.fixture
def two_process_url(env: dict[str, str], worker: Process, logs: Path) -> Iterator[str]:
    port = free_port()
    args = [sys.executable, "-m", "mcp_celery", "serve", "-A", "tests.sample_jobs", "--http", "--port", str(port)]
    server = Process([*args, "--workers", "2"], env, logs / "http-two-workers.log")
    url = f"http://127.0.0.1:{port}/mcp"

    def ready() -> bool:
        assert server.alive(), server.output()
        try:
            return httpx.post(url, json={}, timeout=1).status_code < 500
        except httpx.TransportError:
            return False

    wait_for(ready, 60, 0.1, "the two-process server")
    yield url
    server.stop()


def test_a_task_created_on_one_process_is_served_by_any(two_process_url: str, client: HttpClient) -> None:
    task_ids = []
    for _ in range(6):  # a new connection per call: the kernel spreads them over the processes
        creator = HttpClient(two_process_url)
        task_ids.append(creator.start("echo", {"text": "spread"}))
        creator.close()
    for task_id in task_ids:
        # ...and the single-process test server, a separate process again, reads them too.
        assert client.wait(task_id)["result"]["content"][0]["text"] == "spread"
        reader = HttpClient(two_process_url)
        assert reader.get(task_id)["status"] == "completed"
        reader.close()
