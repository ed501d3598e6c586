"""The client library against a real server and prefork worker, over Streamable HTTP and stdio.

Each test runs its async body with `anyio.run`; every wait is bounded (`anyio.fail_after`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client import ClientRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import (
    CreateMessageRequestParams,
    CreateMessageResult,
    ElicitRequestParams,
    ElicitResult,
    ListRootsResult,
    Root,
    TextContent,
)
from pydantic import FileUrl

from mcp_celery.client import (
    Journal,
    NotATaskError,
    ServerTarget,
    TaskCancelledError,
    TaskFailedError,
    TasksExtension,
    connect,
)
from tests.support.client_fixtures import LISTEN_SERVER_LOG, TOKEN, fastmcp_url, listen_url  # noqa: F401  (fixtures)
from tests.support.harness import ROOT, Process
from tests.support.listen_server import REFUSED, ListenServer

STDIO_COMMAND = (sys.executable, "-m", "mcp_celery", "serve", "-A", "tests.support.sample_jobs")


@pytest.fixture(params=["http", "stdio"])
def target(request: pytest.FixtureRequest, worker: Process) -> ServerTarget:
    if request.param == "http":
        return ServerTarget(url=request.getfixturevalue("http_url"))
    return ServerTarget(command=STDIO_COMMAND, cwd=str(ROOT))


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "tasks.db")


@pytest.fixture
def errlog(logs: Path) -> Iterator[Any]:
    with (logs / "client-stdio-servers.log").open("a") as f:
        yield f


def run(body: Callable[[], Awaitable[None]], timeout: float = 60) -> None:
    async def bounded() -> None:
        with anyio.fail_after(timeout):
            await body()

    anyio.run(bounded)


def text(result: Any) -> str:
    block = result.content[0]
    assert isinstance(block, TextContent), result
    return block.text


def test_plain_call_tool_returns_the_final_result_and_journals_the_task(
    target: ServerTarget, journal: Journal, errlog: Any
) -> None:
    extension = TasksExtension(journal=journal, target=target)

    async def body() -> None:
        async with connect(target, extension, errlog=errlog) as client:
            result = await client.call_tool("echo", {"text": "hi", "times": 2})
            assert text(result) == "hi hi" and not result.is_error
            failed = await client.call_tool("boom", {"message": "bad input"})
            assert failed.is_error and "bad input" in text(failed)

    run(body)
    entries = journal.entries()
    assert [(e.tool, e.status) for e in entries] == [("boom", "completed"), ("echo", "completed")]
    assert entries[0].target == target


def test_handle_is_journaled_before_it_is_returned_and_gives_the_result(
    target: ServerTarget, journal: Journal, errlog: Any
) -> None:
    extension = TasksExtension(journal=journal, target=target)

    async def body() -> None:
        async with connect(target, extension, errlog=errlog) as client:
            handle = await extension.start(client, "checkpoint_loop", {"seconds": 0.5})
            entry = journal.get(handle.task_id)  # written before start() returned
            assert (entry.tool, entry.arguments, entry.status) == ("checkpoint_loop", {"seconds": 0.5}, "working")
            seen: list[str] = []
            final = await handle.wait(on_update=lambda t: seen.append(t.status))
            assert final.status == "completed" and seen[-1] == "completed"
            assert text(await handle.result()).startswith("finished")
            # This server pushes notifications/tasks over subscriptions/listen: no fallback to polling.
            assert extension.state.may_listen(client.session)

    run(body)
    assert journal.get(journal.entries()[0].task_id[:12]).status == "completed"


def test_failed_and_cancelled_tasks_raise_and_an_inline_answer_is_not_a_task(
    target: ServerTarget, journal: Journal, errlog: Any
) -> None:
    extension = TasksExtension(journal=journal, target=target)

    async def body() -> None:
        async with connect(target, extension, errlog=errlog) as client:
            failing = await extension.start(client, "protocol_fail")
            with pytest.raises(TaskFailedError) as failed:
                await failing.result()
            assert (failed.value.code, failed.value.message) == (-32602, "bad thing")
            looping = await extension.start(client, "checkpoint_loop", {"seconds": 30})
            await looping.cancel()
            with pytest.raises(TaskCancelledError):
                await looping.result(timeout=15)
            with pytest.raises(NotATaskError) as inline:
                await extension.start(client, "sync_only", {"text": "abc"})
            assert text(inline.value.result) == "ABC"

    run(body)
    assert journal.get(journal.entries()[0].task_id).status == "cancelled"


def test_an_input_request_is_answered_once_even_with_two_waiters(
    target: ServerTarget, journal: Journal, errlog: Any
) -> None:
    asked: list[str] = []

    async def elicit(ctx: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        asked.append(params.message)
        await anyio.sleep(2.5)  # longer than the poll interval: the server re-sends the key meanwhile
        return ElicitResult(action="accept", content={"confirm": True})

    extension = TasksExtension(journal=journal, target=target)

    async def body() -> None:
        async with connect(target, extension, errlog=errlog, elicitation_callback=elicit) as client:
            handle = await extension.start(client, "ask_one")
            second = extension.attach(client, handle.task_id)
            results: list[str] = []

            async def wait(h: Any) -> None:
                results.append(text(await h.result()))

            async with anyio.create_task_group() as group:
                group.start_soon(wait, handle)
                group.start_soon(wait, second)
            assert results == ["published", "published"]

    run(body)
    assert asked == ["Publish the model?"]


def test_a_task_is_resumed_from_the_journal_by_a_new_client(
    target: ServerTarget, journal: Journal, errlog: Any
) -> None:
    async def start() -> None:
        extension = TasksExtension(journal=journal, target=target)
        async with connect(target, extension, errlog=errlog) as client:
            await extension.start(client, "checkpoint_loop", {"seconds": 1})

    async def resume() -> None:
        entry = journal.entries()[0]
        extension = TasksExtension(journal=journal, target=entry.target)
        async with connect(entry.target, extension, errlog=errlog) as client:
            handle = extension.attach(client, entry.task_id, entry.tool)
            assert text(await handle.result()).startswith("finished")

    run(start)
    assert journal.entries()[0].status == "working"
    run(resume)
    assert journal.entries()[0].status == "completed"


def test_a_client_without_the_extension_gets_synchronous_results(http_url: str) -> None:
    async def body() -> None:
        async with Client(http_url) as client:
            assert text(await client.call_tool("echo", {"text": "sync"})) == "sync"

    run(body)


def test_importing_the_client_loads_neither_celery_nor_redis() -> None:
    probe = "import sys, mcp_celery.client; print(sorted(m for m in ('celery', 'redis') if m in sys.modules))"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_client_modules_themselves_load_neither_celery_nor_redis() -> None:
    """The same contract, with the top-level package replaced by an empty one, as a lazy __init__ would be."""
    probe = (
        "import sys, types; package = types.ModuleType('mcp_celery'); package.__path__ = [sys.argv[1]]; "
        "sys.modules['mcp_celery'] = package; import mcp_celery.client; "
        "print(sorted(m for m in ('celery', 'kombu', 'redis') if m in sys.modules))"
    )
    args = [sys.executable, "-c", probe, str(ROOT / "mcp_celery")]
    out = subprocess.run(args, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_server_that_pushes_notifications_wakes_the_waiter_without_polling() -> None:
    fixture = ListenServer()
    extension = TasksExtension()
    messages: list[str] = []

    async def observe(message: Any) -> None:
        messages.append(type(message).__name__)
        await extension.message_handler(message)

    async def body() -> None:
        async with Client(fixture.server, extensions=[extension], message_handler=observe) as client:
            handle = await extension.start(client, "later")
            final = await handle.wait()
            assert final.status == "completed" and text(await handle.result()) == "pushed"
            assert fixture.gets == 1  # the first look; the end itself was pushed
            assert extension.state.may_listen(client.session)

    run(body, timeout=20)  # the advertised poll interval is a minute
    assert messages == ["SubscriptionsAcknowledgedNotification"]


def test_sampling_and_roots_requests_go_to_the_clients_callbacks(
    target: ServerTarget, journal: Journal, errlog: Any
) -> None:
    async def sample(ctx: ClientRequestContext, params: CreateMessageRequestParams) -> CreateMessageResult:
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text="hi there"), model="m")

    async def roots(ctx: ClientRequestContext) -> ListRootsResult:
        return ListRootsResult(roots=[Root(uri=FileUrl("file:///data"))])

    extension = TasksExtension(journal=journal, target=target)

    async def body() -> None:
        options = {"sampling_callback": sample, "list_roots_callback": roots}
        async with connect(target, extension, errlog=errlog, **options) as client:
            assert text(await client.call_tool("ask_sample_and_roots")) == "hi there / ['file:///data']"

    run(body)


def test_questions_asked_before_the_task_exists_are_answered_first(
    target: ServerTarget, journal: Journal, errlog: Any
) -> None:
    """`ask_first` tools settle an MRTR round on tools/call; start() answers it, then gets the task."""

    async def elicit(ctx: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        assert params.message == "Delete 3 files from b?"
        return ElicitResult(action="accept", content={"confirm": True})

    extension = TasksExtension(journal=journal, target=target)

    async def body() -> None:
        async with connect(target, extension, errlog=errlog, elicitation_callback=elicit) as client:
            handle = await extension.start(client, "delete_files", {"bucket": "b", "count": 3})
            assert text(await handle.result()) == "deleted 3 files from b"

    run(body)
    assert journal.entries()[0].arguments == {"bucket": "b", "count": 3}


@pytest.mark.venv
def test_the_library_against_fastmcp_with_fastmcp_tasks(fastmcp_url: str, journal: Journal) -> None:  # noqa: F811
    target = ServerTarget(url=fastmcp_url)
    extension = TasksExtension(journal=journal, target=target)

    async def body() -> None:
        async with connect(target, extension) as client:
            assert text(await client.call_tool("add", {"a": 2, "b": 3})) == "5"
            handle = await extension.start(client, "slow", {"seconds": 30})
            await handle.cancel()
            with pytest.raises(TaskCancelledError):
                await handle.result(timeout=30)

    run(body)
    assert [(e.tool, e.status) for e in journal.entries()] == [("slow", "cancelled"), ("add", "completed")]


def test_listen_over_http_behind_a_bearer_token(listen_url: str, logs: Path) -> None:  # noqa: F811
    """The push path over Streamable HTTP (listen is an SSE response), and the token on every request."""
    target = ServerTarget(url=listen_url)
    extension = TasksExtension()
    wrong = f"wrong-{uuid.uuid4()}"

    async def body() -> None:
        async with connect(target, extension, token=TOKEN) as client:
            handle = await extension.start(client, "later")
            with anyio.fail_after(20):  # the server's pollIntervalMs is a minute: only a push ends this early
                assert text(await handle.result()) == "pushed"
            assert extension.state.may_listen(client.session)
        with pytest.raises((MCPError, BaseExceptionGroup)) as refused:  # task groups may wrap it
            async with connect(target, TasksExtension(), token=wrong) as client:
                await client.call_tool("later")
        error: BaseException = refused.value
        while isinstance(error, BaseExceptionGroup):
            error = error.exceptions[0]
        # The SDK reports any HTTP error status as the same MCPError: the server says it was the token.
        assert isinstance(error, MCPError), error
        assert REFUSED.format(token=wrong) in (logs / LISTEN_SERVER_LOG).read_text(), "not an auth refusal"

    run(body)
