"""A `subscriptions/listen` stream opened and read to its end, for the tests that watch tasks end by push."""

from __future__ import annotations

import time
from typing import Any

from mcp_celery.testing.jsonrpc import SseStream
from tests.support.harness import HttpClient

SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"


def listen(client: HttpClient, task_ids: list[str], **filters: Any) -> tuple[SseStream, dict[str, Any]]:
    """Open a listen stream for `task_ids` and return it with its acknowledgement."""
    stream = client.stream("subscriptions/listen", {"notifications": {"taskIds": task_ids, **filters}})
    assert stream.status_code == 200
    ack = stream.next()
    assert ack is not None and ack["method"] == "notifications/subscriptions/acknowledged", ack
    assert ack["params"]["_meta"][SUBSCRIPTION_ID] == stream.request_id
    return stream, ack


def notifications_until_end(stream: SseStream, timeout: float = 20) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every `notifications/tasks` params until the listen result, and that result."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while True:
        message = stream.next(max(deadline - time.monotonic(), 0.1))
        assert message is not None, "the stream ended without the listen result"
        if message.get("id") == stream.request_id:
            return seen, message
        assert message["method"] == "notifications/tasks", message  # never progress or log notifications
        seen.append(message["params"])
