"""What the model reads of the fallback is enough, whichever part its host shows it; windows fit the client.

Some hosts show their model only a result's `structuredContent` (pydantic-ai whenever every content
block is text, agent-framework by default): the handle, `task_status`, `task_respond` and
`task_cancel` carry the words whole (`message`), the next call as data (`nextCall`), the example
answer (`exampleAnswer`) and the live output's tail (`outputTail`) there too, valid against the
output schemas they list. The inline window never outlasts the calling client's timeout: a server
of its own here, with a long MCP_CELERY_INLINE_S and its own MCP_CELERY_CLIENT_WINDOWS. A client of the
initialize era over stateless HTTP gets its declaration back in its session id, so its task records
what it declared and its window is its own.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import redis

from mcp_celery.server.plain.windows import KNOWN_CLIENTS
from mcp_celery.store.schema import FIELD, Keys
from mcp_celery.testing.jsonrpc import RawHttpClient
from tests.support.harness import HttpClient, Process, start_http_server

YES = {"action": "accept", "content": {"confirm": True}}


def plain(client: RawHttpClient, tool: str, arguments: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return client.result("tools/call", {"name": tool, "arguments": arguments}, capabilities={}, **kw)


def schemas(client: HttpClient) -> dict[str, dict[str, Any]]:
    """Each tool's output schema as a client without the extension lists it."""
    tools = client.result("tools/list", {}, capabilities={})["tools"]
    return {tool["name"]: tool.get("outputSchema") or {} for tool in tools}


def guided(result: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """The result's structuredContent, checked as an SDK client checks it, with its words whole."""
    structured = dict(result["structuredContent"])
    jsonschema.validate(structured, schema)
    assert structured["message"] == result["content"][0]["text"], result
    return structured


def test_the_handle_of_a_running_job_carries_its_next_call_as_data(client: HttpClient) -> None:
    call = plain(client, "slow_greeting", {"name": "Ada", "seconds": 30})
    handle = guided(call, schemas(client)["slow_greeting"])
    task_id = handle["taskId"]
    assert handle["nextCall"] == {"tool": "task_status", "arguments": {"task_id": task_id, "wait_seconds": 3.0}}
    assert "task_status with " in handle["message"] and "exampleAnswer" not in handle
    status = plain(client, "task_status", handle["nextCall"]["arguments"])
    shown = guided(status, schemas(client)["task_status"])
    assert shown["status"] == "working" and shown["nextCall"] == handle["nextCall"]
    cancel = plain(client, "task_cancel", {"task_id": task_id})
    after = guided(cancel, schemas(client)["task_cancel"])
    assert after["status"] in {"working", "cancelled"} and (after["status"] == "cancelled") != ("nextCall" in after)


def test_a_question_and_the_live_output_come_as_data_in_the_handle_status_and_respond(client: HttpClient) -> None:
    call = plain(client, "narrate", {"lines": 3, "then": 1})  # three lines, then a question
    own = schemas(client)
    handle = guided(call, own["narrate"] or {"type": "object"})
    task_id = handle["taskId"]
    assert handle["status"] == "input_required", handle
    assert handle["exampleAnswer"] == {"elicit-1": YES}
    assert handle["nextCall"] == {
        "tool": "task_respond",
        "arguments": {"task_id": task_id, "responses": {"elicit-1": YES}},
    }
    assert handle["outputTail"] == ["line 0", "line 1", "line 2"] and "line 2" in handle["message"]
    shown = guided(plain(client, "task_status", {"task_id": task_id}), own["task_status"])
    assert shown["exampleAnswer"] == handle["exampleAnswer"] and shown["outputTail"] == handle["outputTail"]

    wrong = plain(client, "task_respond", {"task_id": task_id, "responses": {"elicit-1": {"action": "maybe"}}})
    missed = wrong["structuredContent"]
    jsonschema.validate(missed, own["task_respond"])
    assert wrong["isError"] is True and missed["nextCall"]["tool"] == "task_respond", missed
    assert '"elicit-1": {"action": "accept"' in missed["message"] and missed["exampleAnswer"] == {"elicit-1": YES}

    taken = guided(plain(client, "task_respond", handle["nextCall"]["arguments"]), own["task_respond"])
    assert taken["taken"] == ["elicit-1"] and "exampleAnswer" not in taken, taken
    # Once answered, the job goes on, or has ended already: either way task_status is next (to wait, or to read it).
    assert taken["nextCall"]["tool"] == "task_status" and "task_status with" in taken["message"], taken


# ---------------------------------------------------------------- windows that fit the client

WINDOWS_ENV = {
    "MCP_CELERY_INLINE_S": "20",
    # "slow-host" gets 6 s; a client in neither table gets 2 s; "patient-host" resets on progress.
    "MCP_CELERY_CLIENT_WINDOWS": '{"slow-host": 6, "*": 2}',
    "MCP_CELERY_PROGRESS_CLIENTS": "patient-host",
}


@pytest.fixture(scope="module")
def windows_url(env: dict[str, str], worker: Process, logs: Path) -> Iterator[str]:
    url, server = start_http_server({**env, **WINDOWS_ENV}, logs / "windows-server.log")
    yield url
    server.stop()


def timed_handle(url: str, client_name: str, seconds: float, **kw: Any) -> tuple[dict[str, Any], float]:
    """A plain call of a `seconds` job from the client named `client_name`: its result and how long it took."""
    client = RawHttpClient(url, client_name=client_name)
    started = time.monotonic()
    try:
        result = plain(client, "slow_greeting", {"name": client_name, "seconds": seconds}, **kw)
    finally:
        client.close()
    return result, time.monotonic() - started


def test_the_window_is_the_clients_own_below_its_timeout(windows_url: str) -> None:
    python_sdk = KNOWN_CLIENTS["mcp"]
    assert python_sdk.window_s < python_sdk.timeout_s == 5.0  # openai-agents' client_session_timeout_seconds
    for name, window in (("mcp", python_sdk.window_s), ("slow-host", 6.0), ("never-heard-of", 2.0)):
        result, took = timed_handle(windows_url, name, window + 8)
        assert "taskId" in result["structuredContent"], result
        assert window - 0.5 <= took < window + 2.5, (name, took)
        assert result["structuredContent"]["nextCall"]["arguments"]["wait_seconds"] == window
        # A task_status wait is a call too: capped at the same window, whatever it asks for.
        client = RawHttpClient(windows_url, client_name=name)
        started = time.monotonic()
        arguments = {"task_id": result["structuredContent"]["taskId"], "wait_seconds": 100}
        waited = plain(client, "task_status", arguments)
        assert waited["structuredContent"]["status"] == "working" and time.monotonic() - started < window + 2.5
        plain(client, "task_cancel", {"task_id": arguments["task_id"]})
        client.close()


def test_a_client_that_resets_its_timeout_on_progress_keeps_the_long_window(windows_url: str) -> None:
    result, took = timed_handle(windows_url, "patient-host", 5, meta={"progressToken": "p-1"})
    assert result["structuredContent"] == {"text": "Hello, patient-host!", "length": 20}, result  # inline, at 5 s
    assert took >= 4.5
    # Without a progress token it has no keepalives to hold it: the window of clients not in the table.
    result, took = timed_handle(windows_url, "patient-host", 8)
    assert result["structuredContent"]["status"] == "working" and took < 2 + 2.5, (result, took)


# ---------------------------------------------------------------- the initialize era over stateless HTTP

OLD_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


def test_what_an_initialize_era_client_declared_is_recorded_with_its_task_and_fits_its_window(
    windows_url: str, store_redis: redis.Redis
) -> None:
    client = RawHttpClient(windows_url)
    declared = {"elicitation": {"form": {}}, "roots": {}}
    hello = {"protocolVersion": "2025-11-25", "capabilities": declared, "clientInfo": {"name": "mcp", "version": "1"}}
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}
    reply = client.send_raw(json.dumps(body).encode(), OLD_HEADERS)
    session = reply.headers["mcp-session-id"]
    assert reply.status_code == 200 and session.startswith("mcs1."), reply
    # Each later request is a new stateless POST that carries the session id, as the transport requires.
    later = {**OLD_HEADERS, "Mcp-Protocol-Version": "2025-11-25", "Mcp-Session-Id": session}
    call = {"name": "slow_greeting", "arguments": {"name": "Old", "seconds": 30}}
    started = time.monotonic()
    answer = client.send_raw(
        json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call}).encode(), later
    )
    took = time.monotonic() - started
    handle = answer.json()["result"]["structuredContent"]
    assert handle["status"] == "working" and KNOWN_CLIENTS["mcp"].window_s - 0.5 <= took < 8, (handle, took)
    record = store_redis.hget(Keys().task(handle["taskId"]), FIELD.CAPABILITIES)
    assert json.loads(record or b"{}") == declared  # not {}: what the client said at initialize
    cancel = {"name": "task_cancel", "arguments": {"task_id": handle["taskId"]}}
    client.send_raw(json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": cancel}).encode(), later)
    client.close()
