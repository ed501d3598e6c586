"""Repeated tool calls (issue 47): idempotency keys and dedupe windows, end to end.

A server of this module's own (static tokens for two principals, INFO logs as JSON, metrics on) over
the suite's prefork worker and Redis. The tests of the claims themselves, which are store keys, are
marked `store`: CI's ACL and Cluster passes run them too. The jobs (`tests.support.sample_jobs.count_run*`)
count each run in a marker, the side effect a repeated call must not repeat; with `hold` they run until the test sets
that marker, so that a second call surely comes while the first call's task is unfinished.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from mcp_celery import idempotency
from mcp_celery.core.calls import call_digest
from mcp_celery.logs import key_digest
from mcp_celery.protocol import client_capabilities
from mcp_celery.server.edge import tokens
from mcp_celery.store.schema import Keys
from tests.support.harness import HttpClient, Process, free_port, http_answers, wait_for

METRICS_TOKEN = "idempotency-scrape-5d1e"
#: Each principal's live tasks on the `quota_url` server.
QUOTA = 3


@pytest.fixture(scope="module")
def principals(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    path = tmp_path_factory.mktemp("idempotency-tokens") / "tokens"
    return path, {name: tokens.new_token(name, path) for name in ("alice", "bob")}


def start_server(env: dict[str, str], log: Path) -> tuple[str, Process]:
    """`mcp-celery serve --http` of the sample jobs with INFO logs as JSON lines, once it answers."""
    port = free_port()
    args = [sys.executable, "-m", "mcp_celery", "--log-level", "INFO", "--log-format", "json", "serve"]
    process = Process([*args, "-A", "tests.support.sample_jobs", "--http", "--port", str(port)], env, log)
    url = f"http://127.0.0.1:{port}/mcp"
    process.wait_ready(lambda: http_answers(url), 60, "the server to answer")
    return url, process


@pytest.fixture(scope="module")
def server(
    env: dict[str, str], worker: Process, logs: Path, principals: tuple[Path, dict[str, str]]
) -> Iterator[tuple[str, Path]]:
    """The module's server: its URL and its log. No quota: a key's claim rides in the record's round trip."""
    own = {**env, "MCP_CELERY_AUTH_TOKENS": str(principals[0]), "MCP_CELERY_METRICS_TOKEN": METRICS_TOKEN}
    log = logs / "idempotency-server.log"
    url, process = start_server(own, log)
    yield url, log
    process.stop()


@pytest.fixture(scope="module")
def quota_url(
    env: dict[str, str], worker: Process, logs: Path, principals: tuple[Path, dict[str, str]]
) -> Iterator[str]:
    """A server counting each principal's live tasks (QUOTA): there a claim is taken before the count."""
    own = {**env, "MCP_CELERY_AUTH_TOKENS": str(principals[0]), "MCP_CELERY_MAX_LIVE_TASKS_PER_PRINCIPAL": str(QUOTA)}
    url, process = start_server(own, logs / "idempotency-quota-server.log")
    yield url
    process.stop()


@pytest.fixture
def alice(server: tuple[str, Path], principals: tuple[Path, dict[str, str]]) -> Iterator[HttpClient]:
    client = HttpClient(server[0], principals[1]["alice"])
    yield client
    client.close()


@pytest.fixture
def bob(server: tuple[str, Path], principals: tuple[Path, dict[str, str]]) -> Iterator[HttpClient]:
    client = HttpClient(server[0], principals[1]["bob"])
    yield client
    client.close()


def marker() -> str:
    return f"repeat-{uuid.uuid4().hex[:12]}"


def runs(store_redis: redis.Redis, counter: str) -> int:
    return int(store_redis.get(counter) or 0)


def call(
    client: HttpClient,
    tool: str,
    arguments: dict[str, Any],
    *,
    key: str | None = None,
    via: str = "header",
    tasks: bool = True,
) -> dict[str, Any]:
    """A tools/call's whole reply; `key` goes in the `Idempotency-Key` header or in `_meta` (`via`)."""
    headers = {idempotency.HEADER: key} if key is not None and via == "header" else None
    meta = {idempotency.META: key} if key is not None and via == "meta" else None
    caps = client_capabilities(declare=tasks)
    return client.call(
        "tools/call", {"name": tool, "arguments": arguments}, capabilities=caps, headers=headers, meta=meta
    )


def created(reply: dict[str, Any]) -> dict[str, Any]:
    assert reply.get("result", {}).get("resultType") == "task", reply
    return dict(reply["result"])


def release(store_redis: redis.Redis, hold: str) -> None:
    store_redis.set(hold, 1, ex=600)


# ---------------------------------------------------------------- idempotency keys


@pytest.mark.store
@pytest.mark.parametrize("via", ["header", "meta"])
def test_a_key_sent_twice_gets_the_first_calls_task_and_the_job_runs_once(
    alice: HttpClient, store_redis: redis.Redis, via: str
) -> None:
    counter, hold, key = marker(), marker(), str(uuid.uuid4())
    first = created(call(alice, "count_run", {"counter": counter, "hold": hold}, key=key, via=via))
    wait_for(lambda: runs(store_redis, counter) == 1, 30)  # the job runs: the second call comes while it does
    again = created(call(alice, "count_run", {"counter": counter, "hold": hold}, key=key, via=via))
    assert again == first  # the same CreateTaskResult
    release(store_redis, hold)
    assert alice.wait(first["taskId"], timeout=30)["status"] == "completed"
    after = created(call(alice, "count_run", {"counter": counter, "hold": hold}, key=key, via=via))
    assert after["taskId"] == first["taskId"]  # after the task ended too, while its record lives
    assert alice.get(after["taskId"])["result"]["content"][0]["text"] == "1"
    assert runs(store_redis, counter) == 1


@pytest.mark.store
def test_five_concurrent_calls_with_one_key_make_one_task(
    server: tuple[str, Path], principals: tuple[Path, dict[str, str]], store_redis: redis.Redis
) -> None:
    counter, key = marker(), str(uuid.uuid4())
    replies: list[dict[str, Any]] = []
    start = threading.Barrier(5)

    def one() -> None:
        client = HttpClient(server[0], principals[1]["alice"])
        try:
            client.post("server/discover", capabilities={})  # connected before the barrier
            start.wait(10)
            replies.append(call(client, "count_run", {"counter": counter}, key=key))
        finally:
            client.close()

    threads = [threading.Thread(target=one) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    ids = {created(reply)["taskId"] for reply in replies}
    assert len(replies) == 5 and len(ids) == 1, replies
    client = HttpClient(server[0], principals[1]["alice"])
    try:
        assert client.wait(ids.pop(), timeout=30)["status"] == "completed"
    finally:
        client.close()
    assert runs(store_redis, counter) == 1


@pytest.mark.store
def test_a_key_with_other_arguments_is_refused_naming_it_and_nothing_runs(
    alice: HttpClient, store_redis: redis.Redis
) -> None:
    counter, other, key = marker(), marker(), f"deploy-{uuid.uuid4()}"
    first = created(call(alice, "count_run", {"counter": counter}, key=key))
    refused = call(alice, "count_run", {"counter": other}, key=key)
    assert refused["error"]["code"] == -32602, refused
    assert key in refused["error"]["message"] and "another call" in refused["error"]["message"]
    another_tool = call(alice, "count_run_deduped", {"counter": counter}, key=key)
    assert another_tool["error"]["code"] == -32602, another_tool
    # A call queued after the refused ones has run: a job the refusals had queued would have run before it.
    later = created(call(alice, "count_run", {"counter": marker()}))
    for task_id in (first["taskId"], later["taskId"]):
        assert alice.wait(task_id, timeout=30)["status"] == "completed"
    assert runs(store_redis, counter) == 1 and runs(store_redis, other) == 0


@pytest.mark.store
def test_the_same_key_from_another_principal_gets_a_task_of_its_own(
    alice: HttpClient, bob: HttpClient, store_redis: redis.Redis
) -> None:
    counter, key = marker(), str(uuid.uuid4())
    theirs = created(call(alice, "count_run", {"counter": counter}, key=key))
    mine = created(call(bob, "count_run", {"counter": counter}, key=key))
    assert mine["taskId"] != theirs["taskId"]
    assert alice.wait(theirs["taskId"], timeout=30)["status"] == "completed"
    assert bob.wait(mine["taskId"], timeout=30)["status"] == "completed"
    assert runs(store_redis, counter) == 2
    # Each principal's key stays its own: neither can read the other's task.
    assert "error" in bob.call("tasks/get", {"taskId": theirs["taskId"]})


@pytest.mark.store
def test_under_a_quota_a_repeat_is_not_refused_and_a_refused_call_leaves_its_key_free(
    quota_url: str, principals: tuple[Path, dict[str, str]], store_redis: redis.Redis
) -> None:
    bob = HttpClient(quota_url, principals[1]["bob"])
    try:
        hold, counter, key, first_key = marker(), marker(), str(uuid.uuid4()), str(uuid.uuid4())
        first = created(call(bob, "count_run", {"counter": counter, "hold": hold}, key=first_key))
        held = [first] + [
            created(call(bob, "count_run", {"counter": marker(), "hold": hold})) for _ in range(QUOTA - 1)
        ]
        # At the quota: the repeat of a call gets its task (its first call is what fills the quota) ...
        assert created(call(bob, "count_run", {"counter": counter, "hold": hold}, key=first_key)) == first
        # ... and a new call is refused, its claim given back at once.
        refused = call(bob, "count_run", {"counter": counter}, key=key)
        assert "too many live tasks" in refused["error"]["message"], refused
        assert not store_redis.exists(Keys().idempotency_key("bob", key))
        release(store_redis, hold)
        for task in held:
            assert bob.wait(task["taskId"], timeout=30)["status"] == "completed"
        retried = created(call(bob, "count_run", {"counter": counter}, key=key))  # not held by the refused call
        assert bob.wait(retried["taskId"], timeout=30)["status"] == "completed"
        assert runs(store_redis, counter) == 2  # the first call's run, and the retried call's
    finally:
        bob.close()


@pytest.mark.store
def test_a_claim_whose_task_never_got_written_is_taken_over(alice: HttpClient, store_redis: redis.Redis) -> None:
    """A server that died between the claim and the record leaves the claim behind: the retry creates the task."""
    counter, key = marker(), str(uuid.uuid4())
    digest = call_digest("count_run", {"counter": counter, "hold": ""})  # the arguments as validated: defaults too
    stale = {"task": "never-written", "call": digest, "at": int(time.time() * 1000) - 60_000}
    store_redis.set(Keys().idempotency_key("alice", key), json.dumps(stale), px=600_000)
    task = created(call(alice, "count_run", {"counter": counter}, key=key))
    assert task["taskId"] != "never-written"
    assert alice.wait(task["taskId"], timeout=30)["status"] == "completed"
    assert created(call(alice, "count_run", {"counter": counter}, key=key))["taskId"] == task["taskId"]
    assert runs(store_redis, counter) == 1


def test_a_malformed_key_is_refused(alice: HttpClient) -> None:
    too_long = call(alice, "echo", {"text": "x"}, key="k" * 256)
    assert too_long["error"]["code"] == -32602, too_long
    two = alice.call(
        "tools/call",
        {"name": "echo", "arguments": {"text": "x"}},
        headers={idempotency.HEADER: "one"},
        meta={idempotency.META: "two"},
    )
    assert two["error"]["code"] == -32602 and "two different keys" in two["error"]["message"], two
    not_text = alice.call("tools/call", {"name": "echo", "arguments": {"text": "x"}}, meta={idempotency.META: 7})
    assert not_text["error"]["code"] == -32602, not_text


def test_the_drafts_quoted_header_names_the_same_key_as_a_bare_one(alice: HttpClient) -> None:
    key = str(uuid.uuid4())
    bare = created(call(alice, "echo", {"text": "q"}, key=key))
    quoted = created(call(alice, "echo", {"text": "q"}, key=f'"{key}"'))
    assert quoted["taskId"] == bare["taskId"]


def test_the_server_says_it_honours_keys(alice: HttpClient) -> None:
    discover = alice.result("server/discover", {})
    assert discover["capabilities"]["extensions"][idempotency.SERVER_EXTENSION] == {
        "header": idempotency.HEADER,
        "meta": idempotency.META,
    }


# ---------------------------------------------------------------- the workflow task is deduplicated, its members not


def test_a_workflow_called_twice_with_one_key_runs_its_members_once(
    alice: HttpClient, store_redis: redis.Redis
) -> None:
    members, key = marker(), str(uuid.uuid4())
    arguments = {"n": 3, "marker": members, "at_least_once": True}
    first = created(call(alice, "sweep", arguments, key=key))
    again = created(call(alice, "sweep", arguments, key=key))
    assert again["taskId"] == first["taskId"]
    done = alice.wait(first["taskId"], timeout=60)
    assert done["status"] == "completed" and done["result"]["structuredContent"]["sum"] == 0 + 1 + 4, done
    assert created(call(alice, "sweep", arguments, key=key))["taskId"] == first["taskId"]
    assert {k.decode(): int(v) for k, v in store_redis.hgetall(members).items()} == {"0": 1, "1": 1, "2": 1}


# ---------------------------------------------------------------- dedupe windows (no key)


@pytest.mark.store
def test_within_the_dedupe_window_an_identical_call_gets_the_running_task(
    alice: HttpClient, bob: HttpClient, store_redis: redis.Redis
) -> None:
    counter, hold = marker(), marker()
    arguments = {"counter": counter, "hold": hold}
    first = created(call(alice, "count_run_deduped", arguments))
    wait_for(lambda: runs(store_redis, counter) == 1, 30)
    assert created(call(alice, "count_run_deduped", arguments))["taskId"] == first["taskId"]
    theirs = created(call(bob, "count_run_deduped", arguments))  # another principal: a task of its own
    assert theirs["taskId"] != first["taskId"]
    wait_for(lambda: runs(store_redis, counter) == 2, 30)
    release(store_redis, hold)
    assert alice.wait(first["taskId"], timeout=30)["status"] == "completed"
    assert bob.wait(theirs["taskId"], timeout=30)["status"] == "completed"
    again = created(call(alice, "count_run_deduped", arguments))  # it ended: deploying twice on purpose works
    assert again["taskId"] != first["taskId"]
    assert alice.wait(again["taskId"], timeout=30)["status"] == "completed"
    assert runs(store_redis, counter) == 3


def test_without_a_window_or_a_key_identical_calls_make_two_tasks(alice: HttpClient, store_redis: redis.Redis) -> None:
    counter, hold = marker(), marker()
    arguments = {"counter": counter, "hold": hold}
    first = created(call(alice, "count_run", arguments))
    second = created(call(alice, "count_run", arguments))
    assert second["taskId"] != first["taskId"]
    wait_for(lambda: runs(store_redis, counter) == 2, 30)
    release(store_redis, hold)
    for task in (first, second):
        assert alice.wait(task["taskId"], timeout=30)["status"] == "completed"


# ---------------------------------------------------------------- hosts without the tasks extension


def test_a_plain_call_repeated_with_its_key_waits_on_the_same_task(alice: HttpClient, store_redis: redis.Redis) -> None:
    counter, hold, key = marker(), marker(), str(uuid.uuid4())
    arguments = {"counter": counter, "hold": hold}
    first = call(alice, "count_run", arguments, key=key, tasks=False)  # the window (3 s) ends: a handle
    handle = first["result"]["_meta"]["mcp-celery/task"]
    again = call(alice, "count_run", arguments, key=key, tasks=False)
    assert again["result"]["_meta"]["mcp-celery/task"]["taskId"] == handle["taskId"], again
    release(store_redis, hold)
    ended = call(alice, "count_run", arguments, key=key, tasks=False)  # the job ends within this wait
    assert ended["result"]["content"][0]["text"] == "1" and not ended["result"].get("isError"), ended
    assert runs(store_redis, counter) == 1


def test_a_synchronous_call_repeated_with_its_key_gets_the_first_ones_result(
    alice: HttpClient, store_redis: redis.Redis
) -> None:
    counter, key = marker(), str(uuid.uuid4())
    first = call(alice, "count_run_sync", {"counter": counter}, key=key)
    again = call(alice, "count_run_sync", {"counter": counter}, key=key)
    assert first["result"]["content"][0]["text"] == "1" and again["result"] == first["result"], (first, again)
    assert runs(store_redis, counter) == 1


# ---------------------------------------------------------------- what operators see


def test_logs_carry_the_keys_digest_never_the_key_and_metrics_count_repeats(
    server: tuple[str, Path], alice: HttpClient
) -> None:
    key = f"secret-looking-{uuid.uuid4()}"
    first = created(call(alice, "echo", {"text": "log me"}, key=key))
    assert call(alice, "echo", {"text": "not me"}, key=key)["error"]["code"] == -32602  # refused: not logged either
    created(call(alice, "echo", {"text": "log me"}, key=key))  # its line comes after the refusal's, if any

    def repeat_line() -> dict[str, Any] | None:
        for line in server[1].read_text().splitlines():
            entry = json.loads(line) if line.startswith("{") else {}
            if entry.get("event") == "repeated" and entry.get("task_id") == first["taskId"]:
                return entry
        return None

    entry = wait_for(repeat_line, 10)
    assert entry["idempotency_key"] == key_digest(key) and entry["tool"] == "echo"
    assert key not in server[1].read_text()
    scraped = httpx.get(
        server[0].removesuffix("/mcp") + "/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=10
    ).text
    samples = {
        (s.name, s.labels.get("tool"), s.labels.get("by")): s.value
        for family in text_string_to_metric_families(scraped)
        for s in family.samples
    }
    assert samples[("mcp_celery_deduplicated_total", "echo", "key")] >= 1
