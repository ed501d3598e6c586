"""Clients without the tasks extension: the inline window, progress, the task handle and the lifecycle tools.

Raw JSON-RPC against the session's server and prefork worker: over HTTP, 2026-07-28 requests that do
not declare the extension; over stdio, sessions of the initialize era (2025-11-25 and 2025-06-18).
The SDK clients (mcp 2.3, mcp 1.x, the TypeScript SDK) are in tests/server/plain/test_plain_clients.py. The
suite's servers wait 3 s for a plain call's job (MCP_CELERY_INLINE_S in conftest).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import redis

from mcp_celery.protocol import TASK_HANDLE_META
from mcp_celery.server.plain.handle import GUIDANCE_PROPERTIES, TASK_HANDLE_SCHEMA
from mcp_celery.store.schema import FIELD, Keys
from tests.support import sample_jobs
from tests.support.harness import ROOT, HttpClient, Process, StdioClient, start_http_server, wait_for

LIFECYCLE = {"task_status", "task_respond", "task_cancel"}
NO_SUCH_TASK = "(unknown, expired, or not yours)"
INLINE_S = 3.0


def plain(client: HttpClient, tool: str, arguments: dict[str, Any], **kw: Any) -> dict[str, Any]:
    """A tools/call that declares nothing (no tasks extension, no other capability)."""
    return client.result("tools/call", {"name": tool, "arguments": arguments}, capabilities={}, **kw)


def status(client: HttpClient, task_id: str, wait_seconds: float = 0) -> dict[str, Any]:
    return plain(client, "task_status", {"task_id": task_id, "wait_seconds": wait_seconds})


def handle_of(result: dict[str, Any]) -> dict[str, Any]:
    """The task handle of a plain call whose job ran past the window."""
    assert result["isError"] is False, result
    handle = result["_meta"][TASK_HANDLE_META]
    assert set(handle) == {"taskId", "status"} and handle["status"] in {"working", "input_required"}, handle
    return dict(handle)


def until_terminal(client: HttpClient, task_id: str, timeout: float = 60) -> dict[str, Any]:
    """task_status with waits until the task ends."""
    deadline = time.monotonic() + timeout
    while True:
        result = status(client, task_id, wait_seconds=INLINE_S)
        if result["structuredContent"]["status"] in {"completed", "failed", "cancelled"}:
            return result
        assert time.monotonic() < deadline, result


def celery_state(task_id: str) -> str:
    return str(sample_jobs.app.backend.get_task_meta(task_id, cache=False).get("status"))


def without_clock(task: dict[str, Any]) -> dict[str, Any]:
    """The task without its clock and envelope, and without the words and next call task_status adds."""
    return {k: v for k, v in task.items() if k not in {"ttlMs", "_meta", "resultType", *GUIDANCE_PROPERTIES}}


# ---------------------------------------------------------------- the inline window


def test_a_job_that_ends_within_the_window_answers_with_its_own_result(client: HttpClient) -> None:
    result = plain(client, "slow_greeting", {"name": "Ada", "seconds": 0.2})
    assert result["structuredContent"] == {"text": "Hello, Ada!", "length": 11}
    assert TASK_HANDLE_META not in result.get("_meta", {}) and result["isError"] is False


def test_past_the_window_nothing_is_cancelled_and_the_call_answers_with_the_task_handle(
    client: HttpClient, store_redis: redis.Redis
) -> None:
    m = f"inline-{uuid.uuid4()}"
    started = time.monotonic()
    result = plain(client, "checkpoint_loop", {"seconds": 6, "marker": m})
    assert time.monotonic() - started >= INLINE_S - 0.5  # it waited for the job first
    handle = handle_of(result)
    task_id = handle["taskId"]
    text = result["content"][0]["text"]
    assert "still running" in text and "nothing was cancelled" in text and task_id in text, text
    assert f'task_status with {{"task_id": "{task_id}"' in text and "Last status: step" in text, text
    # The job runs on: no cancel was recorded, and it finishes.
    assert not store_redis.hexists(Keys().task(task_id), FIELD.CANCEL)
    done = until_terminal(client, task_id)
    assert done["structuredContent"]["status"] == "completed", done
    assert done["content"][-1]["text"].startswith("finished "), done
    # Celery stores its own result after the job's outcome reached the record, a moment later.
    wait_for(lambda: celery_state(task_id) == "SUCCESS", 15, what="Celery's own result")


def test_a_tool_sets_its_own_inline_window(client: HttpClient) -> None:
    started = time.monotonic()
    handle = handle_of(plain(client, "short_window", {"seconds": 2.5}))
    assert time.monotonic() - started < INLINE_S  # its 1 s, not the setting's 3 s
    assert until_terminal(client, handle["taskId"])["content"][-1]["text"] == "done"


def test_the_lifecycle_tools_are_listed_only_to_requests_without_the_extension(client: HttpClient) -> None:
    listed = {t["name"]: t for t in client.result("tools/list", {}, capabilities={})["tools"]}
    aware = {t["name"]: t for t in client.result("tools/list", {})["tools"]}
    assert LIFECYCLE <= set(listed) and not LIFECYCLE & set(aware)
    assert set(listed) - LIFECYCLE == set(aware)
    # A structured tool that may answer with a handle accepts the handle too, for plain clients only.
    own = aware["slow_greeting"]["outputSchema"]
    widened = listed["slow_greeting"]["outputSchema"]
    assert widened["anyOf"][1] == TASK_HANDLE_SCHEMA and widened["type"] == "object"
    jsonschema.validate({"text": "Hello, Ada!", "length": 11}, widened)
    jsonschema.validate({"taskId": "abc", "status": "working"}, widened)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"taskId": "abc", "status": "working"}, own)


# ---------------------------------------------------------------- task_status


def test_task_status_gives_the_task_as_tasks_get_does_and_the_jobs_own_result(client: HttpClient) -> None:
    call = plain(client, "slow_greeting", {"name": "Grace", "seconds": INLINE_S + 1.5})
    handle = handle_of(call)
    listed = {t["name"]: t for t in client.result("tools/list", {}, capabilities={})["tools"]}
    jsonschema.validate(call["structuredContent"], listed["slow_greeting"]["outputSchema"])  # as SDK clients check
    assert call["structuredContent"]["taskId"] == handle["taskId"]

    running = status(client, handle["taskId"])
    assert running["structuredContent"]["status"] == "working" and running["isError"] is False
    done = until_terminal(client, handle["taskId"])
    task = client.get(handle["taskId"])  # the same task over the SEP-2663 wire
    assert without_clock(done["structuredContent"]) == without_clock(task)
    job = task["result"]
    assert job["structuredContent"] == {"text": "Hello, Grace!", "length": 13}
    assert done["content"][1:] == job["content"]  # the job's own content blocks follow the words
    assert done["isError"] is False


def test_task_status_waits_until_the_status_changes_and_at_most_the_window(client: HttpClient) -> None:
    handle = handle_of(plain(client, "checkpoint_loop", {"seconds": 60}))
    started = time.monotonic()
    capped = status(client, handle["taskId"], wait_seconds=100)
    assert capped["structuredContent"]["status"] == "working"
    assert INLINE_S - 0.5 <= time.monotonic() - started < 30  # capped at the window, not 100 s

    cancel = threading.Timer(0.3, lambda: HttpClient(client.url).result("tasks/cancel", {"taskId": handle["taskId"]}))
    started = time.monotonic()
    cancel.start()
    changed = status(client, handle["taskId"], wait_seconds=100)
    cancel.join()
    assert changed["structuredContent"]["status"] == "cancelled", changed
    assert time.monotonic() - started < INLINE_S - 0.5  # it answered at the change, not at the cap


def test_a_failed_task_reads_as_an_error_with_its_json_rpc_error(client: HttpClient) -> None:
    task_id = client.start("protocol_fail")  # a task-aware client made it; a plain one reads it
    failed = until_terminal(client, task_id)
    assert failed["isError"] is True and failed["structuredContent"]["error"]["code"] == -32602
    assert "bad thing" in failed["content"][0]["text"]


# ---------------------------------------------------------------- questions, answers, cancel


def test_task_respond_validates_answers_as_tasks_update_does(client: HttpClient) -> None:
    call = plain(client, "confirm_echo", {"text": "hi"})
    handle = handle_of(call)
    assert handle["status"] == "input_required"
    text = call["content"][0]["text"]
    assert "Echo 'hi'?" in text and "confirm: boolean (required)" in text, text
    assert '"elicit-1": {"action": "accept", "content": {"confirm": true}}' in text, text
    task_id = handle["taskId"]

    def respond(responses: dict[str, Any]) -> dict[str, Any]:
        return plain(client, "task_respond", {"task_id": task_id, "responses": responses})

    wrong = respond({"elicit-1": {"action": "accept", "content": {"confirm": "maybe"}}})
    assert wrong["isError"] is True and wrong["structuredContent"]["stillOpen"] == ["elicit-1"]
    assert "does not match the requested schema" in wrong["structuredContent"]["rejected"]["elicit-1"]
    stray = respond({"never-asked": {"ignored": True}})
    assert stray["isError"] is True and stray["structuredContent"]["ignored"] == ["never-asked"]
    assert status(client, task_id)["structuredContent"]["status"] == "input_required"

    taken = respond({"elicit-1": {"action": "accept", "content": {"confirm": True}}})
    assert taken["isError"] is False and taken["structuredContent"]["taken"] == ["elicit-1"]
    assert taken["structuredContent"]["stillOpen"] == [] and "goes on" in taken["content"][0]["text"]
    assert until_terminal(client, task_id)["content"][-1]["text"] == "hi: yes"
    again = respond({"elicit-1": {"action": "accept", "content": {"confirm": False}}})
    assert again["isError"] is True and "not waiting for answers" in again["content"][0]["text"]


def test_task_cancel_stops_a_running_job(client: HttpClient) -> None:
    handle = handle_of(plain(client, "checkpoint_loop", {"seconds": 60}))
    reply = plain(client, "task_cancel", {"task_id": handle["taskId"]})
    assert reply["isError"] is False and reply["structuredContent"]["taskId"] == handle["taskId"]
    done = until_terminal(client, handle["taskId"])
    assert done["structuredContent"]["status"] == "cancelled"
    wait_for(lambda: celery_state(handle["taskId"]) == "REVOKED", 15, what="REVOKED")
    ended = plain(client, "task_cancel", {"task_id": handle["taskId"]})
    assert "ended already (cancelled)" in ended["content"][0]["text"]


def test_unknown_expired_and_foreign_task_ids_all_get_the_same_no_such_task(
    client: HttpClient, stdio: StdioClient, store_redis: redis.Redis
) -> None:
    expired = client.start("echo", {"text": "gone"})
    client.wait(expired)
    store_redis.delete(Keys().task(expired))  # what Redis does once the TTL runs out
    foreign = client.start("echo", {"text": "http's"})  # over stdio the caller is the local user
    client.wait(foreign)
    session(stdio)
    for tool, extra in (("task_status", {}), ("task_respond", {"responses": {}}), ("task_cancel", {})):
        for task_id in ("no-such-id", expired, "x" * 5000):
            reply = plain(client, tool, {"task_id": task_id, **extra})
            assert reply["isError"] is True and NO_SUCH_TASK in reply["content"][0]["text"], reply
        over_stdio = stdio.request(
            "tools/call", {"name": tool, "arguments": {"task_id": foreign, **extra}}, modern=False
        )["result"]
        assert over_stdio["isError"] is True and NO_SUCH_TASK in over_stdio["content"][0]["text"], over_stdio
    assert client.get(foreign)["status"] == "completed"  # untouched


CLASHING_JOBS = """
import os
from celery import Celery
import mcp_celery

app = Celery("clash", broker=os.environ["TEST_BROKER_URL"], backend=os.environ["TEST_RESULT_BACKEND"])

@mcp_celery.tool(app)
def task_status(task_id: str) -> str:
    return task_id
"""


def test_a_job_tool_named_like_a_lifecycle_tool_fails_at_start_in_one_line(env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "clashing_jobs.py").write_text(CLASHING_JOBS)
    serve = [sys.executable, "-m", "mcp_celery", "serve", "-A", "clashing_jobs"]
    both = {**env, "PYTHONPATH": f"{tmp_path}:{ROOT}"}
    refused = subprocess.run(serve, env=both, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().splitlines() == [
        "mcp-celery: tool name(s) task_status belong to the lifecycle tools that clients without the tasks "
        "extension use; pass name=... to rename yours, or set MCP_CELERY_TOOL_FALLBACK=false"
    ], refused.stderr
    off = {**both, "MCP_CELERY_TOOL_FALLBACK": "false"}  # without the fallback the name is free
    served = subprocess.run(serve, env=off, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert served.returncode == 0 and "lifecycle" not in served.stderr, served.stderr


# ---------------------------------------------------------------- questions without a model round trip


def test_a_2026_request_that_declares_elicitation_gets_an_mrtr_round_that_resumes_the_same_task(
    client: HttpClient, stdio: StdioClient
) -> None:
    elicit = {"elicitation": {}}
    asked = client.result("tools/call", {"name": "confirm_echo", "arguments": {"text": "mrtr"}}, capabilities=elicit)
    assert asked["resultType"] == "input_required" and "taskId" not in asked, asked
    (key,) = asked["inputRequests"]
    assert asked["inputRequests"][key]["method"] == "elicitation/create"
    state = asked["requestState"]
    retry = {
        "name": "confirm_echo",
        "arguments": {"text": "mrtr"},
        "inputResponses": {key: {"action": "accept", "content": {"confirm": True}}},
    }
    forged = client.call("tools/call", {**retry, "requestState": state[:-2] + "xx"}, capabilities=elicit)
    assert forged["error"]["code"] == -32602
    other_tool = client.call(
        "tools/call", {**retry, "name": "ask_or_explain", "arguments": {}, "requestState": state}, capabilities=elicit
    )
    assert other_tool["error"]["code"] == -32602
    # Another caller (stdio: the local user) cannot resume it either.
    session(stdio, capabilities=elicit)
    stolen = stdio.request("tools/call", {**retry, "requestState": state}, modern=False)
    assert stolen["error"]["code"] == -32602
    done = client.result("tools/call", {**retry, "requestState": state}, capabilities=elicit)
    assert done["content"][0]["text"] == "mrtr: yes" and done["isError"] is False, done


def test_a_session_client_that_declares_elicitation_is_asked_on_its_session_during_the_window(
    stdio: StdioClient,
) -> None:
    session(stdio, capabilities={"elicitation": {}})
    call = stdio.send_request("tools/call", {"name": "confirm_echo", "arguments": {"text": "session"}}, modern=False)
    asked = None
    while True:
        message = stdio.read_message()
        if message.get("method") == "elicitation/create":
            asked = message
            answer = {"action": "accept", "content": {"confirm": True}}
            stdio.send({"jsonrpc": "2.0", "id": message["id"], "result": answer})
        elif message.get("id") == call and "method" not in message:
            reply = message
            break
    assert asked is not None and asked["params"]["message"] == "Echo 'session'?"
    assert reply["result"]["content"][0]["text"] == "session: yes", reply


def test_without_a_way_to_ask_the_questions_wait_for_task_respond(client: HttpClient) -> None:
    handle = handle_of(plain(client, "confirm_echo", {"text": "later"}))
    shown = status(client, handle["taskId"])
    assert shown["structuredContent"]["status"] == "input_required"
    assert "elicit-1" in shown["structuredContent"]["inputRequests"]
    assert "task_respond" in shown["content"][0]["text"]
    plain(client, "task_cancel", {"task_id": handle["taskId"]})  # frees the worker for the next tests


YES = {"action": "accept", "content": {"confirm": True}}


def seconds_since_the_question(shown: dict[str, Any], answered_at: float) -> float:
    """From the job's question (the task's lastUpdatedAt, when it went input_required) to `answered_at`."""
    assert shown["status"] == "input_required", shown
    asked_at = datetime.fromisoformat(shown["lastUpdatedAt"].replace("Z", "+00:00")).timestamp()
    return answered_at - asked_at


def test_a_question_only_task_respond_can_answer_ends_the_wait_at_once_over_http(client: HttpClient) -> None:
    started = time.monotonic()
    call = plain(client, "confirm_echo", {"text": "early"})  # a 2026-07-28 request that declares nothing
    answered_at, took = time.time(), time.monotonic() - started
    handle = handle_of(call)
    assert handle["status"] == "input_required" and "task_respond" in call["content"][0]["text"], call
    shown = status(client, handle["taskId"])["structuredContent"]
    assert seconds_since_the_question(shown, answered_at) < 1.0 and took < INLINE_S - 0.5, (shown, took)
    respond = {"task_id": handle["taskId"], "responses": {"elicit-1": YES}}
    assert plain(client, "task_respond", respond)["isError"] is False
    assert until_terminal(client, handle["taskId"])["content"][-1]["text"] == "early: yes"
    # Nor is an MRTR round of any use to a caller that declared elicitation in URL mode only (a form question).
    url_only = {"elicitation": {"url": {}}}
    started = time.monotonic()
    call = client.result("tools/call", {"name": "confirm_echo", "arguments": {"text": "url"}}, capabilities=url_only)
    assert handle_of(call)["status"] == "input_required" and time.monotonic() - started < INLINE_S - 0.5, call
    plain(client, "task_cancel", {"task_id": handle_of(call)["taskId"]})  # frees the worker for the next tests


def test_a_question_only_task_respond_can_answer_ends_the_wait_at_once_on_a_session(stdio: StdioClient) -> None:
    session(stdio)  # declares no elicitation: the session cannot be asked
    call = stdio.request("tools/call", {"name": "confirm_echo", "arguments": {"text": "early"}}, modern=False)
    answered_at = time.time()
    handle = handle_of(call["result"])
    arguments = {"task_id": handle["taskId"]}
    shown = stdio.request("tools/call", {"name": "task_status", "arguments": arguments}, modern=False)["result"]
    assert seconds_since_the_question(shown["structuredContent"], answered_at) < 1.0, shown
    respond = {"name": "task_respond", "arguments": {**arguments, "responses": {"elicit-1": YES}}}
    assert stdio.request("tools/call", respond, modern=False)["result"]["isError"] is False


# ---------------------------------------------------------------- progress


def progress_of(messages: list[dict[str, Any]], token: Any) -> list[dict[str, Any]]:
    notes = [m["params"] for m in messages if m.get("method") == "notifications/progress"]
    assert all(n["progressToken"] == token for n in notes), notes
    values = [n["progress"] for n in notes]
    assert values == sorted(set(values)), values  # strictly increasing
    return notes


def test_a_plain_call_with_a_progress_token_gets_each_new_status_as_progress_over_http(client: HttpClient) -> None:
    reply = client.post(
        "tools/call",
        {"name": "legacy_progress", "arguments": {"steps": 15}},
        capabilities={},
        meta={"progressToken": "p-1"},
    )
    messages = reply.messages()
    assert messages[-1]["result"]["content"][0]["text"] == "15"  # the job's own result, at the end
    notes = progress_of(messages, "p-1")
    assert notes, messages
    assert all(n["total"] == 15 and n["message"] == f"{int(n['progress'])}/15" for n in notes if "total" in n), notes
    assert any("total" in n for n in notes)
    # 15 updates 0.1 s apart, at most 4 notifications a second (and a keepalive at most).
    assert len(notes) <= 4 * 1.5 + 3, notes

    quiet = client.post("tools/call", {"name": "legacy_progress", "arguments": {"steps": 3}}, capabilities={})
    assert [m for m in quiet.messages() if m.get("method")] == []  # no token, no progress


def test_a_session_of_the_initialize_era_gets_progress_and_the_handle_over_stdio(stdio: StdioClient) -> None:
    session(stdio, version="2025-06-18")
    call = stdio.send_request(
        "tools/call",
        {"name": "checkpoint_loop", "arguments": {"seconds": 5}, "_meta": {"progressToken": 7}},
        modern=False,
    )
    seen: list[dict[str, Any]] = []
    while (message := stdio.read_message()).get("id") != call:
        seen.append(message)
    notes = progress_of(seen, 7)
    assert any(n["message"].startswith("step ") for n in notes), notes  # the job's own statusMessages
    handle = handle_of(message["result"])
    later = stdio.request(
        "tools/call",
        {"name": "task_status", "arguments": {"task_id": handle["taskId"], "wait_seconds": 3}},
        modern=False,
    )["result"]
    assert later["structuredContent"]["taskId"] == handle["taskId"]


# ---------------------------------------------------------------- resumable


@pytest.fixture
def replica(env: dict[str, str], worker: Process, tmp_path: Path) -> Iterator[tuple[str, Process]]:
    url, server = start_http_server(env, tmp_path / "replica.log")
    yield url, server
    server.stop()


def test_the_handle_works_from_another_replica_and_after_a_server_restart(
    client: HttpClient, env: dict[str, str], replica: tuple[str, Process], tmp_path: Path
) -> None:
    url, server = replica
    first = HttpClient(url)
    handle = handle_of(plain(first, "slow_greeting", {"name": "Linus", "seconds": INLINE_S + 4}))
    first.close()
    server.stop()  # the server that made it is gone
    assert status(client, handle["taskId"])["structuredContent"]["status"] == "working"  # another replica
    url2, again = start_http_server(env, tmp_path / "restarted.log")
    try:
        restarted = HttpClient(url2)
        done = until_terminal(restarted, handle["taskId"])
        assert done["structuredContent"]["result"]["structuredContent"]["text"] == "Hello, Linus!"
        restarted.close()
    finally:
        again.stop()


def test_a_redelivered_job_ends_once_with_its_second_runs_result(client: HttpClient, store_redis: redis.Redis) -> None:
    m = f"die-once-{uuid.uuid4()}"
    result = plain(client, "die_once", {"marker": m})
    if TASK_HANDLE_META in result.get("_meta", {}):
        result = until_terminal(client, handle_of(result)["taskId"])
        text = result["content"][-1]["text"]
    else:
        text = result["content"][0]["text"]  # ran again within the window
    assert text == "runs=2" and store_redis.get(m) == b"2"


# ---------------------------------------------------------------- the fallback off, and forbidden tools


@pytest.fixture(scope="module")
def no_fallback(env: dict[str, str], worker: Process, logs: Path) -> Iterator[HttpClient]:
    url, server = start_http_server({**env, "MCP_CELERY_TOOL_FALLBACK": "false"}, logs / "no-fallback.log")
    client = HttpClient(url)
    yield client
    client.close()
    server.stop()


def test_with_the_fallback_off_a_plain_call_is_synchronous_and_cancelled_after_the_sync_timeout(
    no_fallback: HttpClient, store_redis: redis.Redis
) -> None:
    assert not LIFECYCLE & {t["name"] for t in no_fallback.result("tools/list", {}, capabilities={})["tools"]}
    m = f"off-{uuid.uuid4()}"
    reply = plain(no_fallback, "noting_loop", {"seconds": 30, "marker": m})
    assert reply["isError"] is True and "no result within 5 s, so the job was cancelled" in reply["content"][0]["text"]
    task_id = store_redis.get(m).decode()  # the job noted its id as it started
    assert store_redis.hexists(Keys().task(task_id), FIELD.CANCEL)
    wait_for(lambda: celery_state(task_id) == "REVOKED", 15, what="the job to stop at its next checkpoint")
    unknown = no_fallback.call("tools/call", {"name": "task_status", "arguments": {"task_id": "x"}}, capabilities={})
    assert unknown["error"]["code"] == -32602
    # A synchronous job can never ask, whatever the client declared.
    sync = no_fallback.result(
        "tools/call", {"name": "ask_or_explain", "arguments": {}}, capabilities={"elicitation": {}}
    )
    assert sync["content"][0]["text"].startswith("cannot ask: the tool was called synchronously"), sync


def session(stdio: StdioClient, *, version: str = "2025-11-25", capabilities: dict[str, Any] | None = None) -> None:
    """Open an initialize-era session on the stdio server."""
    init = stdio.request(
        "initialize",
        {"protocolVersion": version, "capabilities": capabilities or {}, "clientInfo": {"name": "old", "version": "1"}},
        modern=False,
    )
    assert init["result"]["protocolVersion"] == version, init
    stdio.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
