"""A lost reply never runs a job twice (issue 47): clients that send a call again with its idempotency key.

The end-to-end tests put `tests.support.dropping_proxy` (loopback TCP) between a client and the suite's HTTP
server: it forwards the `tools/call`, then closes the connection before the reply reaches the client,
as a proxy timeout or a sleeping laptop does. The job (`tests.support.sample_jobs.count_run`) counts its runs in
a Redis marker: the side effect that must happen once. The transport's own rules (which calls it sends
again, when, and never to a server that does not honour keys) are checked on an in-process mock.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import redis
from mcp.client import ClientRequestContext
from mcp_types import ElicitRequestParams, ElicitResult, TextContent

from mcp_celery import idempotency
from mcp_celery.client import Journal, ServerTarget, TasksExtension, connect
from mcp_celery.client._retries import NO_RETRIES, Retries, RetryingTransport
from mcp_celery.protocol import client_capabilities
from tests.support.dropping_proxy import DroppingProxy, dropping_proxy
from tests.support.harness import ROOT, HttpClient, Process, wait_for

FAST = Retries(attempts=3, backoff_s=0.05)
ACCEPTED = {"action": "accept", "content": {"confirm": True}}


@pytest.fixture
def proxy(http_url: str, worker: Process) -> Iterator[DroppingProxy]:
    with dropping_proxy(http_url) as dropping:
        yield dropping


def counter() -> str:
    return f"retried-{uuid.uuid4().hex[:12]}"


def runs(store_redis: redis.Redis, name: str) -> int:
    return int(store_redis.get(name) or 0)


def run(body: Any, timeout: float = 60) -> None:
    async def bounded() -> None:
        with anyio.fail_after(timeout):
            await body()

    anyio.run(bounded)


# ---------------------------------------------------------------- through the proxy that loses the reply


def test_the_library_sends_the_call_again_gets_the_same_task_and_the_job_runs_once(
    proxy: DroppingProxy, store_redis: redis.Redis, tmp_path: Path
) -> None:
    journal = Journal(tmp_path / "tasks.db")
    target = ServerTarget(url=proxy.url)
    extension = TasksExtension(journal=journal, target=target)
    name = counter()

    async def body() -> None:
        async with connect(target, extension, retries=FAST) as client:
            handle = await extension.start(client, "count_run", {"counter": name})
            result = await handle.result(timeout=30)
            assert isinstance(result.content[0], TextContent) and result.content[0].text == "1"

    run(body)
    assert (proxy.dropped, proxy.calls_seen) == (1, 2)  # the first reply was lost, the call sent again
    assert runs(store_redis, name) == 1
    entry = journal.entries()[0]
    assert entry.status == "completed" and entry.idempotency_key  # the key the call was sent with


def test_the_journal_keeps_the_key_every_round_of_the_call_was_sent_with(
    http_url: str, worker: Process, tmp_path: Path
) -> None:
    """A tool that asks first (an MRTR round before the task exists): the call's key is its own, not an answer's."""
    journal = Journal(tmp_path / "tasks.db")
    target = ServerTarget(url=http_url)
    extension = TasksExtension(journal=journal, target=target)
    arguments = {"bucket": "b", "count": 3}

    async def elicit(ctx: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        return ElicitResult(action="accept", content={"confirm": True})

    async def body() -> str:
        async with connect(target, extension, elicitation_callback=elicit) as client:
            return (await extension.start(client, "delete_files", arguments)).task_id

    task_id = anyio.run(body)
    key = journal.get(task_id).idempotency_key
    assert key is not None and key != "confirm"
    host = HttpClient(http_url)
    try:  # the same call, answers included, with the journaled key: the same task
        params = {"name": "delete_files", "arguments": arguments, "inputResponses": {"confirm": ACCEPTED}}
        again = host.result("tools/call", params, capabilities=client_capabilities(elicitation={}),
                            headers={idempotency.HEADER: key})  # fmt: skip
    finally:
        host.close()
    assert again["taskId"] == task_id


def test_an_sdk_call_tool_gets_a_key_and_is_sent_again_too(proxy: DroppingProxy, store_redis: redis.Redis) -> None:
    target = ServerTarget(url=proxy.url)
    extension = TasksExtension()
    name = counter()

    async def body() -> None:
        async with connect(target, extension, retries=FAST) as client:
            result = await client.call_tool("count_run", {"counter": name})
            assert isinstance(result.content[0], TextContent) and result.content[0].text == "1"

    run(body)
    assert (proxy.dropped, proxy.calls_seen) == (1, 2)
    assert runs(store_redis, name) == 1


def test_mcp_celery_call_sends_the_call_again_and_the_job_runs_once(
    proxy: DroppingProxy, store_redis: redis.Redis, tmp_path: Path
) -> None:
    name = counter()
    env = {**os.environ, "MCP_CELERY_CLIENT_JOURNAL": str(tmp_path / "tasks.db"), "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "mcp_celery", "call", "count_run", "--args", json.dumps({"counter": name})]
    done = subprocess.run([*argv, "--url", proxy.url], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "1\n"), done.stderr
    assert "sending it again with its idempotency key" in done.stderr
    assert (proxy.dropped, proxy.calls_seen) == (1, 2)
    assert runs(store_redis, name) == 1
    listing = subprocess.run(
        [sys.executable, "-m", "mcp_celery", "tasks", "list", "--json"], env=env, cwd=ROOT, capture_output=True,
        text=True, timeout=60, check=True,
    )  # fmt: skip
    assert json.loads(listing.stdout)[0]["idempotencyKey"]


def test_without_retries_the_lost_reply_is_an_error_and_nothing_is_sent_twice(
    proxy: DroppingProxy, store_redis: redis.Redis
) -> None:
    target = ServerTarget(url=proxy.url)
    extension = TasksExtension()
    name = counter()
    failed: list[BaseException] = []

    async def body() -> None:
        try:
            async with connect(target, extension, retries=NO_RETRIES) as client:
                await client.call_tool("count_run", {"counter": name})
        except Exception as exc:  # noqa: BLE001 - whatever the SDK makes of a broken connection
            failed.append(exc)

    run(body)
    assert failed and (proxy.dropped, proxy.calls_seen) == (1, 1)
    wait_for(lambda: runs(store_redis, name) == 1, 30)  # the server did create the task: only the reply was lost


def _plain_host_call(proxy: DroppingProxy, store_redis: redis.Redis, key: str | None) -> tuple[dict[str, Any], int]:
    """A host without the tasks extension calls `count_run` (held) through the proxy; the reply is lost while
    the call waits for the job, and the host sends the same request again (`RawHttpClient` reconnects and
    sends again once when its connection breaks). Returns the reply and the job's runs."""
    name, hold = counter(), counter()

    def lose_the_reply_then_release() -> None:
        wait_for(lambda: runs(store_redis, name) >= 1, 30)  # the call waits for the running job now
        proxy.drop_now()
        wait_for(lambda: proxy.calls_seen == 2, 30)  # the host sent the call again
        wait_for(lambda: key is not None or runs(store_redis, name) == 2, 30)  # without a key: a second job
        store_redis.set(hold, 1, ex=600)

    helper = threading.Thread(target=lose_the_reply_then_release)
    helper.start()
    host = HttpClient(proxy.url)
    plain = client_capabilities(declare=False)
    try:
        headers = {idempotency.HEADER: key} if key else None
        params = {"name": "count_run", "arguments": {"counter": name, "hold": hold}}
        reply = host.call("tools/call", params, capabilities=plain, headers=headers)
        helper.join(60)
        handle = reply.get("result", {}).get("_meta", {}).get("mcp-celery/task")
        if handle is not None:  # a slow machine: the window ended first; the model would follow the task so
            status = {"name": "task_status", "arguments": {"task_id": handle["taskId"], "wait_seconds": 30}}
            reply = wait_for(lambda: _ended(host.call("tools/call", status, capabilities=plain)), 60)
    finally:
        host.close()
        helper.join(60)
    return reply, runs(store_redis, name)


def _ended(reply: dict[str, Any]) -> dict[str, Any] | None:
    """A task_status reply of a completed task, as the tool call's result (the job's own content last)."""
    result = reply["result"]
    if result["structuredContent"]["status"] != "completed":
        return None
    return {"result": {**result, "content": result["content"][-1:]}}


def test_a_host_without_the_extension_sending_again_with_its_key_waits_on_the_same_task(
    proxy: DroppingProxy, store_redis: redis.Redis
) -> None:
    reply, count = _plain_host_call(proxy, store_redis, str(uuid.uuid4()))
    assert proxy.dropped == 1
    assert count == 1 and reply["result"]["content"][0]["text"] == "1", reply  # the first job's result


def test_a_host_without_the_extension_sending_again_without_a_key_runs_the_job_twice(
    proxy: DroppingProxy, store_redis: redis.Redis
) -> None:
    """The control: what the key prevents (two tasks, two runs), as issue 47 measured before it."""
    reply, count = _plain_host_call(proxy, store_redis, None)
    assert proxy.dropped == 1
    assert count == 2 and reply["result"]["content"][0]["text"] == "2", reply


# ---------------------------------------------------------------- the transport's rules, on a mock server


class FlakyServer:
    """Answers each POST with `outcomes` in turn (an exception to raise, or an HTTP status), then 200 JSON."""

    def __init__(self, *outcomes: type[Exception] | int) -> None:
        self.outcomes = list(outcomes)
        self.requests: list[httpx2.Request] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        outcome = self.outcomes.pop(0) if self.outcomes else 200
        if isinstance(outcome, type):
            raise outcome("lost on purpose", request=request)
        return httpx2.Response(outcome, json={"jsonrpc": "2.0", "id": 1, "result": {}})


def post(
    server: FlakyServer, body: dict[str, Any], *, honoured: bool = True, retries: Retries = FAST, modern: bool = True
) -> int:
    """POST `body` as the SDK sends a request (`modern`: with the Mcp-Method header) through a `RetryingTransport`;
    the status."""

    async def send() -> int:
        transport = RetryingTransport(httpx2.MockTransport(server), retries, lambda: honoured)
        async with httpx2.AsyncClient(transport=transport) as http:
            headers = {"mcp-method": str(body["method"])} if modern else {}
            return (await http.post("http://mcp.test/mcp", json=body, headers=headers)).status_code

    return anyio.run(send)


def tools_call(meta: dict[str, Any] | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"name": "deploy", "arguments": {}}
    if meta is not None:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}


def test_a_call_gets_a_fresh_key_unless_its_meta_has_one() -> None:
    server = FlakyServer()
    post(server, tools_call())
    post(server, tools_call())
    post(server, tools_call({idempotency.META: "mine"}))
    post(server, tools_call(), modern=False)  # an initialize-era request: no Mcp-Method header
    first, second, own, legacy = (request.headers.get(idempotency.HEADER) for request in server.requests)
    assert first and second and first != second and own is None and legacy


@pytest.mark.parametrize("lost", [httpx2.RemoteProtocolError, httpx2.ReadTimeout, httpx2.ConnectError, 504, 502])
def test_a_call_whose_reply_is_lost_is_sent_again_with_the_same_key(lost: type[Exception] | int) -> None:
    server = FlakyServer(lost, lost)
    assert post(server, tools_call()) == 200
    keys = {request.headers[idempotency.HEADER] for request in server.requests}
    assert len(server.requests) == 3 and len(keys) == 1
    assert len({request.content for request in server.requests}) == 1  # byte for byte


def test_sending_again_is_bounded() -> None:
    server = FlakyServer(*[httpx2.ReadError] * 10)
    with pytest.raises(httpx2.ReadError):
        post(server, tools_call({idempotency.META: "k"}), retries=Retries(attempts=2, backoff_s=0.01))
    assert len(server.requests) == 3
    assert post(FlakyServer(503, 503, 503), tools_call(), retries=Retries(attempts=2, backoff_s=0.01)) == 503


def test_nothing_is_sent_twice_to_a_server_that_does_not_honour_keys_nor_any_other_request() -> None:
    unhonoured = FlakyServer(httpx2.RemoteProtocolError)
    with pytest.raises(httpx2.RemoteProtocolError):
        post(unhonoured, tools_call(), honoured=False)
    assert len(unhonoured.requests) == 1
    other = FlakyServer(httpx2.RemoteProtocolError)
    with pytest.raises(httpx2.RemoteProtocolError):
        post(other, {"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"taskId": "t"}})
    assert len(other.requests) == 1 and idempotency.HEADER not in other.requests[0].headers


def test_retries_are_not_negative() -> None:
    with pytest.raises(ValueError):
        Retries(attempts=-1)


def test_a_journal_from_before_keys_gains_the_column(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE tasks (task_id TEXT PRIMARY KEY, target TEXT NOT NULL, tool TEXT NOT NULL, arguments TEXT,"
            " created_at TEXT NOT NULL, status TEXT NOT NULL, status_message TEXT, updated_at TEXT NOT NULL)"
        )
        db.execute(
            "INSERT INTO tasks VALUES ('old', ?, 'echo', NULL, '2026-01-01', 'completed', NULL, '2026-01-01')",
            (ServerTarget(url="http://x/mcp").to_json(),),
        )
    db.close()
    journal = Journal(path)
    journal.record("new", ServerTarget(url="http://x/mcp"), "echo", {}, "working", idempotency_key="k-1")
    assert {entry.task_id: entry.idempotency_key for entry in journal.entries()} == {"old": None, "new": "k-1"}
