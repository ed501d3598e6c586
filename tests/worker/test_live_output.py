"""Live output (`ctx.output`): what is kept, `resources/read`, the owner check, subscriptions, plain hosts, the CLI.

The store's part runs on the session's Redis; the rest runs `tests.support.sample_jobs.narrate` on the
session's prefork worker behind two `mcp-celery serve --http` replicas of this module, both with the
same bearer tokens: tasks are created on the first and watched through the second, so every
`notifications/resources/updated` the second sends came through Redis from the worker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis

from mcp_celery.protocol import output_dropped, output_uri, split_output_uri
from mcp_celery.server.edge import tokens
from mcp_celery.server.tasks.pacing import OutputPacer
from mcp_celery.store.aio import AsyncStore
from mcp_celery.store.connect import async_client, redis_target, sync_client
from mcp_celery.store.output import last_lines, render, slack
from mcp_celery.store.schema import Keys, Lifetimes
from mcp_celery.store.sync import SyncStore
from mcp_celery.testing.jsonrpc import SseStream
from mcp_celery.testing.processes import wait_for
from tests.support import sample_jobs
from tests.support.harness import ROOT, HttpClient, PersistentRedis, Process, start_http_server, start_worker

KEEP = 1024 * 1024  # MCP_CELERY_OUTPUT_KEEP_BYTES's default, which the replicas and the worker keep

# --- pure: what a reader sees, the pacing ---------------------------------------------------------------


def test_a_reader_sees_the_last_bytes_kept_after_a_line_saying_how_many_were_dropped() -> None:
    assert render(0, b"a\nb\n", 10) == "a\nb\n"
    text = render(5, b"0123456789abcdef", 10)  # 6 bytes of slack cut by the reader, 5 dropped before
    assert text.startswith("[output: 11 earlier bytes dropped; the last 10 are kept") and text.endswith("]\n6789abcdef")
    assert output_dropped(text) == (11, "6789abcdef")
    assert output_dropped("no header\n") == (0, "no header\n")
    cut = render(0, "ééééé".encode(), 5)  # never half a character first
    assert output_dropped(cut) == (6, "éé")
    assert last_lines("1\n2\n\n3\n4\n5\n6\n", 3) == ["4", "5", "6"]
    assert last_lines("x" * 300, 5, width=10) == ["x" * 9 + "…"]
    assert split_output_uri(output_uri("abc_-9")) == "abc_-9"
    for uri in ["mcp-celery://tasks/abc/artifacts/x", "mcp-celery://tasks//output", "mcp-celery://tasks/a/output?x"]:
        assert split_output_uri(uri) is None


def test_an_outputs_updates_are_sent_at_once_after_a_pause_and_at_most_four_a_second() -> None:
    pacer = OutputPacer({"t": "uri-t", "u": "uri-u"})
    pacer.grew({"t", "nobody"})
    assert pacer.take(10.0) == ["uri-t"] and not pacer.due  # the first one at once
    pacer.grew({"t", "u"})
    assert pacer.take(10.1) == ["uri-u"]  # t's quarter second is not over; u has its own
    assert pacer.due and pacer.next_at() == pytest.approx(10.25)
    pacer.grew({"t"})  # more lines meanwhile: still one update
    assert pacer.take(10.2) == [] and pacer.take(10.25) == ["uri-t"]
    sent = []
    for tick in range(100):  # a job printing every 10 ms for a second
        now = 11.0 + tick / 100
        pacer.grew({"t"})
        sent += [now for _ in pacer.take(now)]
    assert len(sent) == 4 and all(b - a >= 0.25 - 1e-9 for a, b in zip(sent, sent[1:], strict=False))


# --- the store: one script per append, the slack, the record's lifetime --------------------------------


@pytest.mark.store
def test_the_store_keeps_the_last_bytes_counts_the_dropped_ones_and_expires_with_the_record(
    store_redis: redis.Redis,
) -> None:
    """On the store as the workers and servers reach it (the ACL user, the cluster in those passes)."""
    task_id, keys = f"output-unit-{uuid.uuid4().hex}", Keys()
    record, output = keys.task(task_id), keys.output(task_id)
    writer = sync_client(redis_target(sample_jobs.STORE), socket_timeout=10)
    store = SyncStore(writer, keys, Lifetimes(60, 60))
    keep = 8192
    assert store.append_output(task_id, b"lost", keep) is False  # no record: nothing is written
    assert not store_redis.exists(output)
    store_redis.hset(record, mapping={"tool": "narrate", "created": "1"})
    store_redis.pexpire(record, 50_000)
    lines = [f"line {i:05d}\n".encode() for i in range(2000)]  # 22,000 bytes
    for line in lines:
        assert store.append_output(task_id, line, keep)
    stored = store_redis.strlen(output)
    assert keep <= stored <= keep + slack(keep)  # cut back only past the slack
    assert 0 < store_redis.pttl(output) <= store_redis.pttl(record) + 1000
    assert store.append_output(task_id, b"y" * 3 * keep, keep)  # longer than what is kept: its head is not sent

    async def read() -> str:
        client = async_client(redis_target(sample_jobs.STORE))
        try:
            dropped, data = await AsyncStore(client, keys, Lifetimes(60, 60)).output(task_id)
            return render(dropped, data, keep)
        finally:
            await client.aclose()

    dropped, kept = output_dropped(anyio.run(read))
    assert kept == "y" * keep and dropped == len(b"".join(lines)) + 2 * keep
    store_redis.expire(record, 5)  # what the job's end does, then its caller:
    store.expire_artifacts(task_id, output=True)
    assert 0 < store_redis.pttl(output) <= 5000  # given the record's 5 s: neither -1 (none) nor -2 (gone)
    store_redis.delete(record, output)
    writer.close()


# --- end to end: two replicas, the session's worker ------------------------------------------------------


class Replicas:
    def __init__(self, first: str, second: str, owner: str, other: str) -> None:
        self.first, self.second = first, second
        self.owner_token, self.other_token = owner, other
        self.a, self.b, self.other = HttpClient(first, owner), HttpClient(second, owner), HttpClient(second, other)

    def read(self, client: HttpClient, task_id: str) -> dict[str, Any]:
        return client.call("resources/read", {"uri": output_uri(task_id)}, name=output_uri(task_id))

    def text(self, client: HttpClient, task_id: str) -> str:
        (contents,) = self.read(client, task_id)["result"]["contents"]
        assert contents["mimeType"] == "text/plain" and contents["uri"] == output_uri(task_id)
        return str(contents["text"])

    def close(self) -> None:
        for client in (self.a, self.b, self.other):
            client.close()


@pytest.fixture(scope="module")
def replicas(
    env: dict[str, str], worker: Process, logs: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replicas]:
    token_file = tmp_path_factory.mktemp("output-tokens") / "tokens"
    owner, other = tokens.new_token("owner", token_file), tokens.new_token("other", token_file)
    authed = {**env, "MCP_CELERY_AUTH_TOKENS": str(token_file)}
    first, first_server = start_http_server(authed, logs / "output-server-1.log")
    second, second_server = start_http_server(authed, logs / "output-server-2.log")
    made = Replicas(first, second, owner, other)
    yield made
    made.close()
    second_server.stop()
    first_server.stop()


def listen(client: HttpClient, uris: list[str]) -> tuple[SseStream, dict[str, Any]]:
    stream = client.stream("subscriptions/listen", {"notifications": {"resourceSubscriptions": uris}})
    assert stream.status_code == 200
    ack = stream.next()
    assert ack is not None and ack["method"] == "notifications/subscriptions/acknowledged", ack
    return stream, ack["params"]["notifications"]


def updates_until_end(stream: SseStream, timeout: float = 60) -> list[float]:
    """When each `notifications/resources/updated` arrived (monotonic), until the listen result."""
    arrived: list[float] = []
    deadline = time.monotonic() + timeout
    while True:
        message = stream.next(max(deadline - time.monotonic(), 0.1))
        assert message is not None, "the stream ended without the listen result"
        if message.get("id") == stream.request_id:
            return arrived
        assert message["method"] == "notifications/resources/updated", message
        assert message["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == stream.request_id
        arrived.append(time.monotonic())


@pytest.mark.store
def test_the_output_reads_while_the_job_waits_and_after_it_ended_from_either_replica(replicas: Replicas) -> None:
    task_id = replicas.a.start("narrate", {"lines": 3, "then": 2}, elicitation={})
    asked = replicas.a.wait(task_id, {"input_required"}, timeout=60)
    assert replicas.text(replicas.b, task_id) == "line 0\nline 1\nline 2\n"  # the job is still running
    ((key, _),) = asked["inputRequests"].items()
    answer = {"action": "accept", "content": {"confirm": True}}
    replicas.a.result("tasks/update", {"taskId": task_id, "inputResponses": {key: answer}})
    assert replicas.a.wait(task_id, timeout=60)["status"] == "completed"
    assert replicas.text(replicas.b, task_id) == "line 0\nline 1\nline 2\nmore 0\nmore 1\n"
    assert replicas.text(replicas.a, task_id) == replicas.text(replicas.b, task_id)


@pytest.mark.store
def test_another_principal_an_unknown_and_an_expired_task_get_the_artifacts_not_found(
    replicas: Replicas, store_redis: redis.Redis
) -> None:
    task_id = replicas.a.start("narrate", {"lines": 1})
    replicas.a.wait(task_id, timeout=60)
    answers = [replicas.read(replicas.other, task_id), replicas.read(replicas.b, "no-such-task")]
    artifact = f"mcp-celery://tasks/{task_id}/artifacts/nothing.txt"
    answers.append(replicas.b.call("resources/read", {"uri": artifact}, name=artifact))
    record = f"mcp-celery:task:{{{task_id}}}"
    assert 0 < store_redis.pttl(f"{record}:output") <= store_redis.pttl(record) + 1000  # expires with the task
    store_redis.delete(record)  # what Redis does at the TTL
    answers.append(replicas.read(replicas.b, task_id))
    for answer in answers:
        assert answer["error"] == {"code": -32602, "message": "Resource not found", "data": answer["error"]["data"]}


@pytest.mark.store
def test_another_principals_listen_to_a_live_tasks_output_is_not_acknowledged_and_the_owners_is(
    replicas: Replicas, store_redis: redis.Redis
) -> None:
    task_id = replicas.a.start("narrate", {"lines": 1, "then": 1}, elicitation={})
    replicas.a.wait(task_id, {"input_required"}, timeout=60)  # it lives on, waiting for an answer
    uri = output_uri(task_id)
    foreign, foreign_ack = listen(replicas.other, [uri])
    foreign.close()
    owned, owner_ack = listen(replicas.b, [uri])
    owned.close()
    assert store_redis.exists(f"mcp-celery:task:{{{task_id}}}")  # refused as foreign, not as gone
    assert "resourceSubscriptions" not in foreign_ack, foreign_ack
    assert owner_ack["resourceSubscriptions"] == [uri], owner_ack
    replicas.a.result("tasks/cancel", {"taskId": task_id})


@pytest.mark.store
def test_a_long_output_keeps_its_last_mebibyte_after_the_dropped_bytes_line(replicas: Replicas) -> None:
    task_id = replicas.a.start("narrate", {"lines": 300, "width": 4096})  # 1.2 MiB
    replicas.a.wait(task_id, timeout=60)
    dropped, kept = output_dropped(replicas.text(replicas.b, task_id))
    total = sum(len(f"line {i} {'x' * 4096}\n") for i in range(300))
    assert dropped > 0 and dropped + len(kept.encode()) == total and len(kept.encode()) <= KEEP
    assert kept.endswith(f"line 299 {'x' * 4096}\n")


@pytest.mark.store
def test_a_subscriber_on_the_second_replica_gets_updates_batched_at_most_four_a_second(replicas: Replicas) -> None:
    task_id = replicas.a.start("narrate", {"lines": 100, "every": 0.02})  # 100 lines over 2 s and more
    stream, ack = listen(replicas.b, [output_uri(task_id), "mcp-celery://tasks/x/artifacts/y"])
    assert ack["resourceSubscriptions"] == [output_uri(task_id)]
    arrived = updates_until_end(stream)
    stream.close()
    assert len(arrived) >= 3, arrived
    # The server spaces them by 0.25 s; arrival times may bunch a little under load, never by a lot.
    assert len(arrived) <= 4 * (arrived[-1] - arrived[0]) + 2, arrived
    assert replicas.text(replicas.b, task_id).endswith("line 99\n")  # read after the last update: all there


@pytest.mark.store
def test_one_stream_carries_a_tasks_states_and_its_outputs_updates_and_ends_after_both(replicas: Replicas) -> None:
    task_id = replicas.a.start("narrate", {"lines": 4, "every": 0.3})
    uri = output_uri(task_id)
    stream = replicas.b.stream(
        "subscriptions/listen", {"notifications": {"taskIds": [task_id], "resourceSubscriptions": [uri]}}
    )
    ack = stream.next()
    assert ack is not None and ack["params"]["notifications"] == {"taskIds": [task_id], "resourceSubscriptions": [uri]}
    methods = []
    deadline = time.monotonic() + 60
    while (message := stream.next(max(deadline - time.monotonic(), 0.1))) is not None and "id" not in message:
        methods.append((message["method"], message["params"].get("status")))
    stream.close()
    assert message is not None and message["id"] == stream.request_id  # the listen result: the stream ended
    assert ("notifications/tasks", "completed") in methods and ("notifications/resources/updated", None) in methods
    states = [status for method, status in methods if method == "notifications/tasks"]
    assert states.count("completed") == 1 and states[-1] == "completed", methods  # nothing after the end


@pytest.mark.store
def test_a_plain_hosts_task_status_shows_the_outputs_last_lines(replicas: Replicas) -> None:
    task_id = replicas.a.start("narrate", {"lines": 12})
    replicas.a.wait(task_id, timeout=60)
    status = replicas.b.result(
        "tools/call", {"name": "task_status", "arguments": {"task_id": task_id}}, capabilities={}
    )
    texts = [block["text"] for block in status["content"] if block["type"] == "text"]
    tail = next(text for text in texts if output_uri(task_id) in text)
    assert tail.splitlines()[1:] == [f"line {i}" for i in range(7, 12)]  # the last five, no more


@pytest.mark.store
def test_the_cli_call_shows_the_live_output(replicas: Replicas, tmp_path: Path) -> None:
    env = {**os.environ, "MCP_CELERY_CLIENT_JOURNAL": str(tmp_path / "journal"), "PYTHONPATH": str(ROOT)}
    cli = [sys.executable, "-m", "mcp_celery", "call", "narrate", "--url", replicas.first]
    arguments = json.dumps({"lines": 4, "every": 0.2})
    token = ["--token", replicas.owner_token]
    shown = subprocess.run([*cli, "--args", arguments, *token], env=env, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert [line for line in shown.stderr.splitlines() if line.startswith("line ")] == [f"line {i}" for i in range(4)]
    assert shown.stdout.strip() == "4 lines"
    quiet = subprocess.run(
        [*cli, "--args", arguments, *token, "--quiet"], env=env, capture_output=True, text=True, timeout=120
    )
    assert quiet.returncode == 0 and "line 0" not in quiet.stderr, quiet.stderr


def test_a_job_goes_on_while_the_stores_redis_is_unreachable_and_only_that_output_is_lost(
    env: dict[str, str], own_redis: PersistentRedis, tmp_path: Path
) -> None:
    """The store on a Redis of the test's own, stopped while the job prints and started again (its
    append-only file keeps the record): the job neither fails nor waits, the lines printed meanwhile
    are lost (the worker says so), and the lines before and after are there."""
    own = {**env, "MCP_CELERY_REDIS_URL": f"{own_redis.url}/0"}
    url, server = start_http_server(own, tmp_path / "server.log")
    queue = sample_jobs.OUTAGE_QUEUE
    worker = start_worker(own, tmp_path / "worker.log", queues=queue, name=f"outage-{own_redis.port}")
    client = HttpClient(url)
    gate = str(tmp_path / "gate")
    try:
        task_id = client.start("narrate_through_outage", {"gate": gate})
        wait_for(lambda: read_output(client, task_id) == "before\n", 60, 0.05, "the line printed before")
        own_redis.stop()
        Path(f"{gate}.down").touch()
        wait_for(lambda: Path(f"{gate}.written").exists(), 30, 0.05, "the job to print while Redis is stopped")
        assert worker.alive()
        own_redis.start()
        Path(f"{gate}.up").touch()
        done = client.wait(task_id, timeout=60)
        assert done["status"] == "completed" and done["result"]["content"][0]["text"] == "went on", done
        assert read_output(client, task_id) == "before\nafter\n"
        assert worker.output().count("Redis unreachable; this output is lost") == 3, worker.tail()
    finally:
        client.close()
        server.stop()
        worker.stop()


def read_output(client: HttpClient, task_id: str) -> str:
    uri = output_uri(task_id)
    (contents,) = client.result("resources/read", {"uri": uri}, name=uri)["contents"]
    return str(contents["text"])
