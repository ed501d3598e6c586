"""Push: `notifications/tasks` over `subscriptions/listen` (checklist items 6, 31), across replicas.

Two server processes (A: the session's, B: this module's) and two prefork workers (the session's
`main` and this module's `second`) share one Redis. Tasks are created on A and watched on B, so
every notification B sends travelled through Redis from whichever worker ran the job. A third
server, C, differs only in its long cancel grace, so that what it pushes after a cancel cannot
come from its grace running out.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from mcp_celery.protocol import TERMINAL_STATUSES
from tests.support import sample_jobs
from tests.support.harness import (
    HttpClient,
    Process,
    StdioClient,
    caps,
    redis_commands_during,
    start_http_server,
    start_worker,
    wait_for,
)
from tests.support.push import SUBSCRIPTION_ID, listen, notifications_until_end

#: Redis connections replica B may open (MCP_CELERY_REDIS_MAX_CONNECTIONS).
POOL = 4


@pytest.fixture(scope="module")
def second_worker(env: dict[str, str], worker: Process, logs: Path) -> Iterator[Process]:
    proc = start_worker(env, logs / "second-worker.log", name=f"second-{os.getpid()}")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def replica_b(env: dict[str, str], second_worker: Process, logs: Path) -> Iterator[tuple[str, Process]]:
    bounded = {**env, "MCP_CELERY_REDIS_MAX_CONNECTIONS": str(POOL)}
    url, server = start_http_server(bounded, logs / "http-server-b.log")
    yield url, server
    server.stop()


#: Replica C's cancel grace, far longer than any wait on it: a `cancelled` it pushes sooner came from
#: the job's own REVOKED event, never from C's grace timer (listen.py) running out.
PATIENT_GRACE_S = 60


@pytest.fixture(scope="module")
def patient(env: dict[str, str], worker: Process, logs: Path) -> Iterator[HttpClient]:
    """Replica C: the same tasks, but a cancel grace of PATIENT_GRACE_S."""
    patient_env = {**env, "MCP_CELERY_CANCEL_GRACE_S": str(PATIENT_GRACE_S)}
    url, server = start_http_server(patient_env, logs / "http-server-c.log")
    c = HttpClient(url)
    yield c
    c.close()
    server.stop()


@pytest.fixture
def b(replica_b: tuple[str, Process]) -> Iterator[HttpClient]:
    c = HttpClient(replica_b[0])
    yield c
    c.close()


def check_notifications(seen: list[dict[str, Any]], subscription_id: int) -> None:
    """Every notification is a DetailedTask stamped with the subscription; each one says something new."""
    for task in seen:
        assert task["_meta"][SUBSCRIPTION_ID] == subscription_id
        assert "resultType" not in task
    keys = [(t["taskId"], t["status"], t.get("statusMessage"), tuple(sorted(t.get("inputRequests", {})))) for t in seen]
    assert all(a != b for a, b in zip(keys, keys[1:], strict=False)), keys
    for task_id in {t["taskId"] for t in seen}:
        mine = [t for t in seen if t["taskId"] == task_id]
        terminal = [i for i, t in enumerate(mine) if t["status"] in TERMINAL_STATUSES]
        assert terminal == [len(mine) - 1], mine  # exactly one terminal, and nothing after it


def without_clock(task: dict[str, Any]) -> dict[str, Any]:
    """A task without the fields that move with the clock (ttlMs grows while a task lives) or the envelope."""
    return {k: v for k, v in task.items() if k not in {"ttlMs", "_meta", "resultType"}}


@pytest.mark.store
@pytest.mark.single_redis
def test_a_listen_reads_each_task_once_for_both_its_ownership_and_its_first_state(
    client: HttpClient, b: HttpClient
) -> None:
    """MONITOR on a listen over three finished tasks: one HGETALL each (sent in one pipeline)."""
    task_ids = [client.wait(client.start("echo", {"text": str(i)}))["taskId"] for i in range(3)]
    for task_id in task_ids:
        client.get(task_id)  # any first-terminal work is done by now

    def listen_to_the_end() -> None:
        stream, ack = listen(b, task_ids)
        assert sorted(ack["params"]["notifications"]["taskIds"]) == sorted(task_ids)
        seen, _ = notifications_until_end(stream)
        stream.close()
        assert sorted(t["taskId"] for t in seen) == sorted(task_ids)

    names = redis_commands_during(sample_jobs.BACKEND, task_ids, listen_to_the_end)
    assert names.count("HGETALL") == 3, names


@pytest.mark.store
def test_a_listener_on_another_replica_gets_every_change_from_current_state_to_terminal(
    client: HttpClient, b: HttpClient
) -> None:
    task_id = client.start("checkpoint_loop", {"seconds": 0.4})  # created on A
    stream, ack = listen(b, [task_id, f"unknown-{uuid.uuid4()}"])  # watched on B
    assert ack["params"]["notifications"]["taskIds"] == [task_id]  # unknown ids are left out
    seen, end = notifications_until_end(stream)
    stream.close()
    assert end["result"]["_meta"][SUBSCRIPTION_ID] == stream.request_id
    check_notifications(seen, stream.request_id)
    assert seen[0]["status"] in {"working", "completed"}  # the current state comes first
    messages = [t.get("statusMessage") for t in seen]
    assert any(m and m.startswith("step ") for m in messages), messages  # progress as statusMessage
    final = seen[-1]
    assert final["status"] == "completed" and final["result"]["content"][0]["text"].startswith("finished")
    assert without_clock(final) == without_clock(client.get(task_id))  # exactly what tasks/get returns


@pytest.mark.store
def test_a_failed_task_is_pushed_with_its_error_and_a_tool_error_with_its_result(
    client: HttpClient, b: HttpClient
) -> None:
    failing = client.start("protocol_fail")
    erring = client.start("boom", {"message": "disk full"})
    stream, ack = listen(b, [failing, erring])
    assert set(ack["params"]["notifications"]["taskIds"]) == {failing, erring}
    seen, _ = notifications_until_end(stream)
    stream.close()
    check_notifications(seen, stream.request_id)
    last = {t["taskId"]: t for t in seen}
    assert last[failing]["status"] == "failed" and "result" not in last[failing]
    assert last[failing]["error"] == {"code": -32602, "message": "bad thing", "data": {"why": "testing"}}
    assert last[erring]["status"] == "completed" and last[erring]["result"]["isError"] is True
    for task_id in (failing, erring):
        assert without_clock(last[task_id]) == without_clock(client.get(task_id))


@pytest.mark.store
def test_input_required_is_pushed_with_its_requests_and_the_answer_resumes_the_job(
    client: HttpClient, b: HttpClient
) -> None:
    task_id = client.start("ask_one", elicitation={})
    stream, _ = listen(b, [task_id])
    seen: list[dict[str, Any]] = []
    while not seen or seen[-1]["status"] != "input_required":
        message = stream.next()
        assert message is not None and message["method"] == "notifications/tasks", message
        seen.append(message["params"])
    asked = seen[-1]
    assert without_clock(asked) == without_clock(client.get(task_id))  # inputRequests as tasks/get has them
    (key,) = asked["inputRequests"]
    client.result(
        "tasks/update", {"taskId": task_id, "inputResponses": {key: {"action": "accept", "content": {"confirm": True}}}}
    )
    rest, _ = notifications_until_end(stream)
    stream.close()
    check_notifications(seen + rest, stream.request_id)
    assert rest[-1]["status"] == "completed" and rest[-1]["result"]["content"][0]["text"] == "published"
    assert all("inputRequests" not in t for t in rest)


@pytest.mark.result_backend
@pytest.mark.store
def test_a_cancel_on_one_replica_is_pushed_by_another_as_soon_as_the_job_stops_at_a_checkpoint(
    client: HttpClient, patient: HttpClient
) -> None:
    """Cancelled on A, watched on C (grace PATIENT_GRACE_S): well within C's grace, only the job's own
    REVOKED event can end C's stream; a job that ignored the cancel would run on for 30 s and C would
    show it completed."""
    task_id = client.start("checkpoint_loop", {"seconds": 30})
    client.wait(task_id, {"working"})
    stream, _ = listen(patient, [task_id])
    first = stream.next()
    assert first is not None and first["params"]["status"] == "working"
    client.result("tasks/cancel", {"taskId": task_id})
    cancelled_at = time.monotonic()
    rest, _ = notifications_until_end(stream, timeout=2 * PATIENT_GRACE_S)
    pushed_after = time.monotonic() - cancelled_at
    stream.close()
    assert rest[-1]["status"] == "cancelled" and "grace" not in rest[-1].get("statusMessage", ""), rest[-1]
    assert sample_jobs.app.backend.get_task_meta(task_id, cache=False)["status"] == "REVOKED"  # the job's own
    assert pushed_after < PATIENT_GRACE_S / 2, f"pushed {pushed_after:.1f} s after the cancel: not on the job's event"


@pytest.mark.store
def test_a_job_that_ignores_a_cancel_is_pushed_cancelled_when_the_grace_runs_out(
    client: HttpClient, b: HttpClient
) -> None:
    task_id = client.start("stubborn", {"seconds": 4, "marker": f"m-{uuid.uuid4()}"})
    wait_for(lambda: client.get(task_id).get("statusMessage") == "running", 15, what="the job to start")
    stream, _ = listen(b, [task_id])
    client.result("tasks/cancel", {"taskId": task_id})
    seen, _ = notifications_until_end(stream, timeout=10)  # no state is stored when the grace ends
    stream.close()
    assert seen[-1]["status"] == "cancelled" and "grace" in seen[-1]["statusMessage"]


@pytest.mark.broker
@pytest.mark.store
def test_a_task_still_queued_is_not_sent_until_it_changes_its_creation_answer_told_that_state(
    client: HttpClient, b: HttpClient
) -> None:
    handle = client.result(
        "tools/call",
        {"name": "queued_elsewhere", "arguments": {"marker": f"m-{uuid.uuid4()}"}},  # queue "later": no worker here
        capabilities=caps(),
    )
    assert (handle["status"], handle["statusMessage"]) == ("working", "queued")
    queued, done = handle["taskId"], client.wait(client.start("echo", {"text": "done"}))["taskId"]
    assert (client.get(queued)["status"], client.get(queued)["statusMessage"]) == ("working", "queued")
    stream, ack = listen(b, [queued, done])
    assert sorted(ack["params"]["notifications"]["taskIds"]) == sorted([queued, done])
    first = stream.next()
    assert first is not None and first["params"]["taskId"] == done and first["params"]["status"] == "completed"
    client.result("tasks/cancel", {"taskId": queued})  # its first change since the creation answer
    seen, _ = notifications_until_end(stream)
    stream.close()
    assert [(t["taskId"], t["status"]) for t in seen] == [(queued, "cancelled")]  # nothing said before the change
    check_notifications([first["params"], *seen], stream.request_id)


@pytest.mark.store
def test_task_ids_need_the_extension_and_the_core_filters_keep_working_beside_them(
    client: HttpClient, b: HttpClient
) -> None:
    task_id = client.start("echo", {"text": "x"})
    refused = b.post("subscriptions/listen", {"notifications": {"taskIds": [task_id]}}, capabilities={})
    assert refused.json()["error"]["code"] == -32021  # item 6
    assert refused.json()["error"]["data"]["requiredCapabilities"]["extensions"]

    stream, ack = listen(b, [task_id], toolsListChanged=True)
    assert ack["params"]["notifications"] == {"taskIds": [task_id], "toolsListChanged": True}
    while (message := stream.next()) is not None and message["params"]["status"] not in TERMINAL_STATUSES:
        pass
    assert message is not None and message["params"]["status"] == "completed"
    with pytest.raises(TimeoutError):  # the tools-list subscription keeps the stream open
        stream.next(timeout=1.0)
    stream.close()

    core_only = b.stream("subscriptions/listen", {"notifications": {"toolsListChanged": True}}, capabilities={})
    first = core_only.next()
    assert first is not None and first["params"]["notifications"] == {"toolsListChanged": True}
    core_only.close()


@pytest.mark.store
def test_listen_over_stdio_pushes_notifications_while_other_requests_are_served(stdio: StdioClient) -> None:
    created = stdio.request("tools/call", {"name": "checkpoint_loop", "arguments": {"seconds": 0.4}})["result"]
    task_id = created["taskId"]
    listen_id = stdio.send_request("subscriptions/listen", {"notifications": {"taskIds": [task_id]}})
    # The stream is open while other requests on the same connection are answered.
    assert stdio.request("tasks/get", {"taskId": task_id})["result"]["taskId"] == task_id
    end = stdio.reply(listen_id)
    assert end["result"]["_meta"][SUBSCRIPTION_ID] == listen_id
    pushed = [
        m for m in stdio.inbox if m.get("method") in {"notifications/tasks", "notifications/subscriptions/acknowledged"}
    ]
    assert pushed[0]["method"] == "notifications/subscriptions/acknowledged"
    assert pushed[0]["params"]["notifications"]["taskIds"] == [task_id]
    tasks = [m["params"] for m in pushed[1:]]
    check_notifications(tasks, listen_id)
    assert tasks[-1]["status"] == "completed"
    assert not [m for m in stdio.inbox if m.get("method") in {"notifications/progress", "notifications/message"}]
    refused = stdio.request("subscriptions/listen", {"notifications": {"taskIds": [task_id]}}, capabilities=caps(False))
    assert refused["error"]["code"] == -32021


def server_connections(store: redis.Redis, pid: int) -> list[dict[str, Any]]:
    return [c for c in store.client_list() if c.get("name") == f"mcp-celery-server:{pid}"]


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def files_besides_redis(store: redis.Redis, pid: int) -> int:
    """The server's open files less its Redis connections, which its pool may grow up to its
    bound under load and keep (bounded on their own by POOL): what remains must not grow."""
    return open_fds(pid) - len(server_connections(store, pid))


@pytest.mark.store
@pytest.mark.single_redis
def test_abandoned_listen_streams_release_their_subscriptions_connections_and_memory(
    replica_b: tuple[str, Process], store_redis: redis.Redis
) -> None:
    """Two rounds of 200 listen streams, each abandoned by its client without a word.

    After each round the server's pub/sub connection holds no subscription and the server holds
    no more Redis connections than its pool's bound (4 in this module's replica, the event
    listener's included), nor more open files besides those than before. The first round lets the allocator
    reach its working size; after the second the memory has not grown: nothing is kept per
    abandoned stream.
    """
    url, server = replica_b
    b = HttpClient(url)
    task_id = b.start("queued_elsewhere", {"marker": f"m-{uuid.uuid4()}"})  # queued for ever: streams stay open

    def round_of(count: int) -> tuple[int, int, int]:
        streams = []
        for _ in range(count):
            stream, _ = listen(b, [task_id])
            streams.append(stream)
        assert [int(c["sub"]) for c in server_connections(store_redis, server.pid)].count(1) == 1
        for stream in streams:
            stream.close()  # abandoned: the client goes away without a word
        wait_for(
            lambda: all(int(c["sub"]) == 0 for c in server_connections(store_redis, server.pid)),
            30,
            0.1,
            "the server to drop the abandoned subscriptions",
        )
        return (
            len(server_connections(store_redis, server.pid)),
            files_besides_redis(store_redis, server.pid),
            rss_kib(server.pid),
        )

    idle = diagnostics(server)
    connections, files, rss = round_of(200)
    wait_for(
        lambda: files_besides_redis(store_redis, server.pid) <= files, 30, 0.1, "the first round's sockets to close"
    )
    connections_after, _, rss_after = round_of(200)
    assert connections <= POOL and connections_after <= POOL, (connections, connections_after)
    wait_for(
        lambda: files_besides_redis(store_redis, server.pid) <= files,
        30,
        0.1,
        f"the server to close the abandoned sockets (had {files} files besides Redis connections)",
    )
    assert rss_after - rss < 5_000, (rss, rss_after)  # KiB
    # The server's own count of what it holds: asyncio tasks, watched channels, watchers.
    wait_for(lambda: diagnostics(server) == idle, 30, 0.2, f"the server's counts to return to {idle}")
    assert idle["watchers"] == 0 and idle["watched_channels"] == 0
    b.result("tasks/cancel", {"taskId": task_id})
    b.close()


def diagnostics(server: Process) -> dict[str, int]:
    """The counts the server logs on SIGUSR1 (`mcp-celery diagnostics: name=count ...`)."""
    before = server.output().count("mcp-celery diagnostics:")
    os.kill(server.pid, signal.SIGUSR1)
    wait_for(lambda: server.output().count("mcp-celery diagnostics:") > before, 10, 0.05, "the diagnostics line")
    line = server.output().split("mcp-celery diagnostics:")[-1].splitlines()[0]
    return {name: int(count) for name, count in (pair.split("=") for pair in line.split())}


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")
