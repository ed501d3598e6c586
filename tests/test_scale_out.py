"""Several server processes serve the same tasks: no task state lives in a server's memory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import HttpClient, Process, start_http_server


@pytest.fixture
def two_process_url(env: dict[str, str], worker: Process, logs: Path) -> Iterator[str]:
    url, server = start_http_server(env, logs / "http-two-workers.log", "--workers", "2")
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
