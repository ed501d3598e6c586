"""Jobs that ask the client for input while they run (SEP-2663 §1.7, checklist items 15-16, 21-26).

End to end on a real prefork worker and real Redis: the job calls `ctx.elicit()` / `ctx.ask()` /
`ctx.sample()` / `ctx.roots()`, the task shows `input_required` with `inputRequests`, the client
answers with `tasks/update`, and the job carries on. The wire keys are read from `inputRequests`,
never guessed, so these tests do not depend on how the server names them.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Mapping
from typing import Any, cast

import pytest
import redis
from celery.result import AsyncResult

from mcp_celery.core.status import READY_STATES
from mcp_celery.store.schema import Keys
from tests.support import sample_jobs
from tests.support.harness import HttpClient, Process, StdioClient, caps, wait_for

#: Capabilities of a client that declares the tasks extension and form elicitation.
ELICIT = caps(elicitation={})
#: Fields of a task; none of them may appear on a tasks/update acknowledgement (item 21).
TASK_FIELDS = {
    "taskId", "status", "statusMessage", "createdAt", "lastUpdatedAt", "ttlMs", "pollIntervalMs",
    "inputRequests", "result", "error", "requestState",
}  # fmt: skip
KEYS = Keys()  # the default key prefix, which the test servers use


def accept(**content: Any) -> dict[str, Any]:
    return {"action": "accept", "content": content}


def marker() -> str:
    return f"runs-{uuid.uuid4()}"


def celery_state(task_id: str) -> tuple[str, dict[str, Any]]:
    """Celery's own view of the job, state and meta (read afresh: AsyncResult caches only ready states)."""
    result: AsyncResult[Any] = AsyncResult(task_id, app=sample_jobs.app)
    state, info = str(result.state), result.info
    return state, info if isinstance(info, dict) else {}


class Rpc:
    """The same raw JSON-RPC calls over Streamable HTTP or over stdio."""

    def __init__(self, transport: HttpClient | StdioClient) -> None:
        self.transport = transport

    def call(
        self, method: str, params: Mapping[str, Any], capabilities: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """The whole JSON-RPC reply (`result` or `error`)."""
        caps_ = caps() if capabilities is None else capabilities
        if isinstance(self.transport, HttpClient):
            return self.transport.call(method, params, capabilities=caps_)
        return self.transport.request(method, params, capabilities=caps_)

    def result(
        self, method: str, params: Mapping[str, Any], capabilities: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        reply = self.call(method, params, capabilities)
        assert "result" in reply, reply
        return dict(reply["result"])

    def start(
        self, tool: str, arguments: Mapping[str, Any] | None = None, capabilities: Mapping[str, Any] = ELICIT
    ) -> str:
        created = self.result("tools/call", {"name": tool, "arguments": dict(arguments or {})}, capabilities)
        assert created["resultType"] == "task", created
        return str(created["taskId"])

    def get(self, task_id: str) -> dict[str, Any]:
        task = self.result("tasks/get", {"taskId": task_id})
        assert task["resultType"] == "complete", task  # item 15
        return task

    def update(self, task_id: str, responses: Mapping[str, Any]) -> dict[str, Any]:
        ack = self.result("tasks/update", {"taskId": task_id, "inputResponses": dict(responses)})
        assert ack["resultType"] == "complete", ack  # item 21
        assert not TASK_FIELDS & set(ack), ack
        return ack

    def wait(self, task_id: str, statuses: set[str], timeout: float = 20.0) -> dict[str, Any]:
        return wait_for(
            lambda: t if (t := self.get(task_id))["status"] in statuses else None, timeout, 0.02, f"{statuses}"
        )

    def wait_inputs(self, task_id: str, count: int = 1, timeout: float = 20.0) -> dict[str, Any]:
        """The task once it is input_required with `count` outstanding requests; returns the task."""

        def check() -> dict[str, Any] | None:
            task = self.get(task_id)
            assert task["status"] not in {"completed", "failed", "cancelled"}, task
            ok = task["status"] == "input_required" and len(task["inputRequests"]) == count
            return task if ok else None

        return wait_for(check, timeout, 0.02, f"{task_id} to ask {count} question(s)")

    def wait_done(self, task_id: str, timeout: float = 20.0) -> dict[str, Any]:
        return self.wait(task_id, {"completed", "failed", "cancelled"}, timeout)


def text_of(task: Mapping[str, Any]) -> str:
    assert task["status"] == "completed", task
    return "".join(part["text"] for part in task["result"]["content"] if part["type"] == "text")


def only_key(task: Mapping[str, Any]) -> str:
    (key,) = task["inputRequests"]
    return str(key)


@pytest.fixture
def http(client: HttpClient) -> Rpc:
    return Rpc(client)


@pytest.fixture(params=["http", "stdio"])
def rpc(request: pytest.FixtureRequest) -> Rpc:
    """The tests using this run once over Streamable HTTP and once over stdio."""
    return Rpc(request.getfixturevalue("client" if request.param == "http" else "stdio"))


@pytest.fixture(params=["http", "stdio"])
def patient_rpc(request: pytest.FixtureRequest) -> Rpc:
    """As `rpc`, on servers whose cancel grace no wait here reaches (conftest.PATIENT_GRACE_S)."""
    return Rpc(request.getfixturevalue("patient_client" if request.param == "http" else "patient_stdio"))


# ------------------------------------------------------------------ HTTP and stdio


@pytest.mark.result_backend
@pytest.mark.store
def test_one_question_is_shown_answered_with_an_empty_ack_and_the_job_continues(rpc: Rpc) -> None:
    task_id = rpc.start("ask_one")
    task = rpc.wait_inputs(task_id)
    key = only_key(task)
    request = task["inputRequests"][key]
    assert request["method"] == "elicitation/create"
    assert request["params"]["mode"] == "form"
    assert request["params"]["requestedSchema"] == sample_jobs.CONFIRM
    assert "requestState" not in task
    # The job itself is parked in the custom Celery state (what Flower shows).
    wait_for(lambda: celery_state(task_id)[0] == "INPUT_REQUIRED", 20, what="Celery state INPUT_REQUIRED")
    assert rpc.get(task_id)["inputRequests"] == {key: request}  # re-sent on every poll until answered

    rpc.update(task_id, {key: accept(confirm=True)})
    after = rpc.get(task_id)  # read-your-writes: the answered key is gone at once (item 16)
    assert after["status"] in {"working", "completed"}, after
    assert "inputRequests" not in after
    assert text_of(rpc.wait_done(task_id)) == "published"


@pytest.mark.result_backend
@pytest.mark.store
def test_two_questions_answered_in_two_updates_stay_input_required_until_both_are_in(rpc: Rpc) -> None:
    task_id = rpc.start("ask_two")
    task = rpc.wait_inputs(task_id, count=2)  # both outstanding at once
    by_message = {r["params"]["message"]: k for k, r in task["inputRequests"].items()}
    first, second = by_message["First name?"], by_message["Second name?"]
    assert first != second

    rpc.update(task_id, {first: accept(name="A")})
    partial = rpc.get(task_id)  # item 24: partial answers are kept, the rest still asked
    assert partial["status"] == "input_required", partial
    assert set(partial["inputRequests"]) == {second}
    assert partial["inputRequests"][second] == task["inputRequests"][second]

    rpc.update(task_id, {second: accept(name="B")})
    assert text_of(rpc.wait_done(task_id)) == "A and B"


@pytest.mark.result_backend
@pytest.mark.store
def test_an_answer_that_does_not_match_the_schema_is_acked_but_the_question_stays(rpc: Rpc) -> None:
    task_id = rpc.start("ask_one")
    task = rpc.wait_inputs(task_id)
    key = only_key(task)

    rpc.update(task_id, {key: {"action": "accept", "content": {"confirm": "yes"}}})  # confirm must be a boolean
    still = rpc.get(task_id)
    assert still["status"] == "input_required", still
    assert still["inputRequests"] == task["inputRequests"]

    rpc.update(task_id, {key: accept(confirm=True)})
    assert text_of(rpc.wait_done(task_id)) == "published"


@pytest.mark.result_backend
@pytest.mark.store
def test_answers_under_unknown_keys_or_of_the_wrong_shape_are_acked_and_change_nothing(rpc: Rpc) -> None:
    task_id = rpc.start("ask_one")
    task = rpc.wait_inputs(task_id)
    key = only_key(task)

    rpc.update(task_id, {"nope": {"ignored": True}})  # item 23: a key never issued
    rpc.update(task_id, {"nope": 42, "other": "not an InputResponse"})  # ... holding no InputResponse at all
    rpc.update(task_id, {key: 42})  # the outstanding key, but not an ElicitResult
    rpc.update(task_id, {key: {"action": "maybe"}})
    still = rpc.get(task_id)
    assert still["status"] == "input_required"
    assert still["inputRequests"] == task["inputRequests"]
    assert celery_state(task_id)[0] not in READY_STATES  # the job was not woken into a result

    unknown = rpc.call(
        "tasks/update", {"taskId": f"no-such-{uuid.uuid4()}", "inputResponses": {key: accept(confirm=True)}}
    )
    assert unknown["error"]["code"] == -32602, unknown  # item 22
    undeclared = rpc.call(
        "tasks/update",
        {"taskId": task_id, "inputResponses": {key: accept(confirm=True)}},
        caps(declare=False, elicitation={}),
    )
    assert undeclared["error"]["code"] == -32021, undeclared  # item 5: gate before lookup
    assert rpc.get(task_id)["inputRequests"] == task["inputRequests"]  # that answer was not taken

    rpc.update(task_id, {key: accept(confirm=False)})
    assert text_of(rpc.wait_done(task_id)) == "kept"


@pytest.mark.result_backend
@pytest.mark.store
def test_cancelling_a_task_waiting_for_input_wakes_the_job_which_ends_it_cancelled(patient_rpc: Rpc) -> None:
    rpc = patient_rpc
    # A tool that never parks: at the park window's end (MCP_CELERY_PARK_AFTER_S, 30 s, as long as the
    # wait below) the park itself would end a cancelled task, and the test could not tell it from a wake-up.
    task_id = rpc.start("ask_one_holding", {"timeout": 60})
    only_key(rpc.wait_inputs(task_id))
    wait_for(lambda: celery_state(task_id)[0] == "INPUT_REQUIRED", 20, what="the job to wait")

    ack = rpc.result("tasks/cancel", {"taskId": task_id})
    assert ack["resultType"] == "complete" and not TASK_FIELDS & set(ack), ack
    # The server's grace is far beyond this wait: only the job itself, woken by the cancel rather than
    # left to its 60 s timeout, can end the task now. How soon it stops is a goal of `python -m bench`
    # (the cancel phase), not of this test.
    task = wait_for(lambda: (t := rpc.get(task_id))["status"] == "cancelled" and t, 30, 0.005, "cancelled")
    assert "inputRequests" not in task and "grace" not in task.get("statusMessage", ""), task
    assert celery_state(task_id)[0] == "REVOKED"  # stored by the job as it stopped, before the task read cancelled


@pytest.mark.result_backend
@pytest.mark.store
def test_an_unanswered_question_times_out_into_a_tool_error_and_is_withdrawn(
    rpc: Rpc, store_redis: redis.Redis
) -> None:
    task_id = rpc.start("ask_one", {"timeout": 1})
    # The 1 s window may be missed by a slow poll; the error text below proves the question was asked.
    seen = rpc.wait(task_id, {"input_required", "completed", "failed", "cancelled"})
    task = rpc.wait_done(task_id)
    assert task["status"] == "completed" and task["result"]["isError"] is True, task
    text = text_of(task)
    assert "InputTimeout" in text and "within the timeout" in text, text
    if seen["status"] == "input_required":
        assert only_key(seen) in text  # the message names the question that timed out
    assert "inputRequests" not in task
    record = {k.decode() if isinstance(k, bytes) else k for k in store_redis.hkeys(KEYS.task(task_id))}
    assert not {f for f in record if f.startswith("in:")}, record  # withdrawn from the record too


# ------------------------------------------------------------------ HTTP


@pytest.mark.result_backend
@pytest.mark.store
def test_input_keys_are_unique_for_the_tasks_life_and_an_answered_key_is_never_taken_again(http: Rpc) -> None:
    task_id = http.start("two_rounds", {"marker": marker()})
    first = only_key(http.wait_inputs(task_id))
    http.update(task_id, {first: accept(name="Ann")})

    second_task = http.wait_inputs(task_id)
    second = only_key(second_task)
    assert second != first  # item 25: a fresh key for the second question
    assert second_task["inputRequests"][second]["params"]["message"] == "Second?"

    http.update(task_id, {first: accept(name="Zed")})  # the first key again: already answered, ignored
    again = http.get(task_id)
    assert again["status"] == "input_required" and set(again["inputRequests"]) == {second}

    http.update(task_id, {second: accept(name="Bob")})
    assert text_of(http.wait_done(task_id)) == "Ann,Bob,runs=1"  # "Zed" never reached the job


@pytest.mark.store
def test_a_client_without_elicitation_gets_the_input_not_supported_text_and_a_plain_one_with_it_is_asked(
    http: Rpc,
) -> None:
    task_id = http.start("ask_or_explain", capabilities=caps())  # tasks extension, no elicitation
    text = text_of(http.wait_done(task_id))
    assert text.startswith("cannot ask: ") and "did not declare the 'elicitation' capability" in text, text

    # Without the extension the job still asks: a client that declared elicitation gets an MRTR round
    # (tests/server/plain/test_plain_hosts.py has the rest, and the synchronous case with the fallback off).
    plain = http.result("tools/call", {"name": "ask_or_explain", "arguments": {}}, caps(declare=False, elicitation={}))
    assert plain["resultType"] == "input_required" and "taskId" not in plain, plain
    assert only_key(plain) == "elicit-1" and plain["requestState"].startswith("mcp-celery.1."), plain


@pytest.mark.result_backend
@pytest.mark.store
def test_sampling_and_roots_requests_are_asked_in_turn_and_their_answers_reach_the_job(http: Rpc) -> None:
    task_id = http.start("ask_sample_and_roots", capabilities=caps(sampling={}, roots={}))
    sample_task = http.wait_inputs(task_id)
    sample_key = only_key(sample_task)
    sample = sample_task["inputRequests"][sample_key]
    assert sample["method"] == "sampling/createMessage"
    assert sample["params"]["maxTokens"] == 10
    assert sample["params"]["messages"][0]["content"]["text"] == "Say hi"
    http.update(task_id, {sample_key: {"role": "assistant", "content": {"type": "text", "text": "hi"}, "model": "m"}})

    def roots_asked() -> dict[str, Any] | None:
        task = http.get(task_id)
        assert sample_key not in task.get("inputRequests", {}), task  # never asked again
        return task if task["status"] == "input_required" else None

    roots_task = wait_for(roots_asked, 20, 0.02, "the roots request")
    roots_key = only_key(roots_task)
    assert roots_key != sample_key
    assert roots_task["inputRequests"][roots_key]["method"] == "roots/list"
    http.update(task_id, {roots_key: {"roots": [{"uri": "file:///tmp"}]}})

    text = text_of(http.wait_done(task_id))
    assert "hi" in text and "file:///tmp" in text, text


@pytest.mark.broker
@pytest.mark.result_backend
@pytest.mark.store
def test_a_redelivered_job_replays_the_answers_already_given_instead_of_asking_again(
    http: Rpc, store_redis: redis.Redis, worker: Process
) -> None:
    """What is observable, and why it shows the replay.

    The job `two_rounds` counts its executions in a marker, then asks two questions. After the
    first is answered and the second is outstanding, the same job is published again with the
    same task id: a duplicate delivery, while the first execution is still blocked on the second
    question. The re-run starts (marker 2; Celery's tracer writes STARTED over the meta before
    the body runs), and then:

    * the first key never shows again in `inputRequests`: the re-run did not re-post it;
    * the re-run parks in INPUT_REQUIRED on the *second* key, which it can reach only once its
      own first `ctx.elicit()` has returned, although nobody answered that question again: the
      stored answer was replayed; the second question keeps its key and request.

    Answering the second key completes the task with the first answer. Which execution delivers
    that result is not determined: both wait on the same bell, a list that wakes one waiter per
    answer (Redis serves the longest-blocked client first, normally the first execution, so
    `runs=1`); a waiter that is done passes the ring on, so the other execution wakes too. Both
    then return; the worker log shows the re-run returned "Ann" too (`runs=2`), the end-to-end
    proof of the replay, and since Celery never overwrites SUCCESS the later result changes
    nothing on the task. Which of the two the task reports is a race between the two stores,
    so the test accepts either and checks that it never changes.
    """
    m = marker()
    task_id = http.start("two_rounds", {"marker": m})
    first = only_key(http.wait_inputs(task_id))
    http.update(task_id, {first: accept(name="Ann")})
    second_task = http.wait_inputs(task_id)
    second = only_key(second_task)
    assert second != first
    wait_for(lambda: waiting_on(task_id, second), 20, what="the first execution to wait on the second question")
    assert store_redis.get(m) == b"1"

    cast(Any, sample_jobs.two_rounds).apply_async(kwargs={"marker": m}, task_id=task_id)  # the duplicate delivery

    def rerun_waits_on_second() -> bool:
        task = http.get(task_id)
        assert task["status"] == "input_required", task
        assert set(task["inputRequests"]) == {second}, task  # the first question is never asked again
        if store_redis.get(m) != b"2":
            return False  # the re-run has not started its body yet
        state, info = celery_state(task_id)
        assert state not in READY_STATES, (state, info)
        return waiting_on(task_id, second)

    wait_for(rerun_waits_on_second, 30, 0.02, "the re-run to reach the second question")
    assert http.get(task_id)["inputRequests"] == second_task["inputRequests"]  # same key, same request

    http.update(task_id, {second: accept(name="Bob")})
    done = http.wait_done(task_id)
    result = text_of(done)
    assert re.fullmatch(r"Ann,Bob,runs=[12]", result), result

    # The execution that took the answer's ring passes it on, so both return; the worker's log
    # shows what each returned: the re-run too answers "Ann", which it was never asked for.
    returned = wait_for(lambda: returns(worker, task_id, 2), 20, 0.05, "both executions to end")
    assert sorted(returned) == ["Ann,Bob,runs=1", "Ann,Bob,runs=2"], returned
    # Which result the task reports is whichever execution stored its result first; the log's
    # order is not the store's order (each child logs after it stores), so only membership holds.
    assert result in returned
    assert text_of(http.get(task_id)) == result  # the later result changed nothing


def waiting_on(task_id: str, key: str) -> bool:
    """Whether Celery's meta says the job is parked waiting for exactly the question `key`."""
    state, info = celery_state(task_id)
    return state == "INPUT_REQUIRED" and info.get("keys") == [key]


def returns(worker: Process, task_id: str, count: int) -> list[str] | None:
    """The values the session worker logged for the executions of `task_id` that succeeded,
    in the order they ended, once there are `count` of them."""
    pattern = rf"Task [\w.]+\[{re.escape(task_id)}\] succeeded in [^:]+: '([^']*)'"
    found = re.findall(pattern, worker.output())
    return found if len(found) >= count else None


def test_mrtr_questions_are_settled_on_tools_call_before_the_task_is_created(http: Rpc) -> None:
    arguments = {"bucket": "b", "count": 3}
    round1 = http.result("tools/call", {"name": "delete_files", "arguments": arguments}, ELICIT)
    assert round1["resultType"] == "input_required", round1
    assert "taskId" not in round1 and "status" not in round1
    confirm = round1["inputRequests"]["confirm"]
    assert confirm["method"] == "elicitation/create" and confirm["params"]["requestedSchema"] == sample_jobs.CONFIRM

    round2 = http.result(
        "tools/call",
        {"name": "delete_files", "arguments": arguments, "inputResponses": {"confirm": accept(confirm=True)}},
        ELICIT,
    )
    assert round2["resultType"] == "task", round2  # item 14: MRTR first, then the task
    assert "inputRequests" not in round2 and "requestState" not in round2
    task_id = round2["taskId"]
    assert text_of(http.wait_done(task_id)) == "deleted 3 files from b"

    nothing = http.result("tools/call", {"name": "delete_files", "arguments": {"bucket": "b", "count": 0}}, ELICIT)
    assert nothing["resultType"] == "task", nothing  # no question to ask: a task at once
    assert text_of(http.wait_done(nothing["taskId"])) == "nothing to delete"

    no_elicitation = http.call("tools/call", {"name": "delete_files", "arguments": arguments}, caps())
    assert no_elicitation["error"]["code"] == -32021, no_elicitation
    assert "elicitation" in no_elicitation["error"]["data"]["requiredCapabilities"], no_elicitation


@pytest.mark.broker
def test_flower_sees_a_task_input_required_event_for_a_waiting_job(http: Rpc) -> None:
    app = sample_jobs.app
    subscribed = threading.Event()
    seen: list[dict[str, Any]] = []
    failure: list[BaseException] = []
    receivers: list[Any] = []

    def listen() -> None:
        try:
            with app.connection() as connection:
                receiver = app.events.Receiver(
                    connection, handlers={"task-input_required": seen.append, "*": lambda event: subscribed.set()}
                )
                receivers.append(receiver)
                # wakeup=True asks every worker for a heartbeat once the receiver is subscribed.
                receiver.capture(limit=None, timeout=None, wakeup=True)
        except BaseException as exc:  # noqa: BLE001
            failure.append(exc)

    thread = threading.Thread(target=listen, name="event-receiver", daemon=True)
    thread.start()
    try:
        # Redis fan-out is pub/sub: an event is only seen if the receiver subscribed before it was sent.
        wait_for(lambda: subscribed.is_set() or failure, 30, what="the receiver's first event")
        assert not failure, failure
        task_id = http.start("ask_one")
        key = only_key(http.wait_inputs(task_id))
        wait_for(lambda: failure or any(e.get("uuid") == task_id for e in seen), 20, what="the event")
        assert not failure, failure
        event = next(e for e in seen if e.get("uuid") == task_id)
        assert event["type"] == "task-input_required" and event["keys"] == [key], event
        assert event["hostname"].startswith("main@"), event  # sent by the worker running the job
        http.update(task_id, {key: accept(confirm=True)})
        assert text_of(http.wait_done(task_id)) == "published"
    finally:
        for receiver in receivers:
            receiver.should_stop = True
        thread.join(timeout=10)
    assert not thread.is_alive()
