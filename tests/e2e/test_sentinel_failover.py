"""A Sentinel failover under load: with MCP_CELERY_REDIS_MIN_REPLICAS=1 no acknowledged task is lost.

A primary, a replica and three sentinels (real redis-server processes on loopback ports) hold
everything: Celery's broker (database 0) and results (database 1) as Celery's own `sentinel://`
URLs with `master_name`, and mcp-celery's state, which follows the result backend. A prefork
worker and an HTTP server run on them. Client threads create 200 `ask_one` tasks and answer each
one's question; a third of the way in, the primary is SIGKILLed, Sentinel promotes the replica,
and the killed node comes back as the new primary's replica (without one, no write could be
confirmed at all). Clients retry what was refused, as a real client would; a task counts as
acknowledged once a client holds its id, an answer once `tasks/update` said so.

Then every acknowledged task must still exist and end; every answered one must not have waited
in vain for its answer (an `InputTimeout`); every refusal during the switch must have been a
JSON-RPC error, never an HTTP 500 or a request left hanging; and the primaries must have run a WAIT
for every task created after the kill (INFO commandstats of the nodes alive at the end). On loopback
a failover loses nothing even without MIN_REPLICAS (the replica is microseconds behind), so the run
alone cannot tell the setting works: the WAITs show it was applied, and
`test_with_min_replicas_a_task_no_replica_confirmed_is_refused_and_cancelled` shows what it refuses.
Without MIN_REPLICAS the same run sends no WAIT and prints what it lost, since Redis replicates
asynchronously, unless Sentinel fails over twice (on a loaded machine the new primary can miss its
pings for a second): writes the second-to-last primary took after the last one stopped copying it
are gone then, and the note shows it (`summary`, whose wording a test pins).
"""

from __future__ import annotations

import datetime
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from mcp_celery.protocol import INTERNAL_ERROR, TERMINAL_STATUSES
from mcp_celery.server.engine.reaper import LOST_BEFORE_START
from mcp_celery.testing.processes import wait_for
from tests.support.harness import HttpClient, Process, caps, start_http_server, start_worker
from tests.support.redis_topologies import MASTER_NAME, SentinelGroup, start_plain, start_sentinel_group

TASKS = 200
CLIENTS = 8
#: A job's question waits this long for its answer; an answer lost in the failover shows as its timeout.
ANSWER_TIMEOUT_S = 25
ACCEPT = {"action": "accept", "content": {"confirm": True}}
UNKNOWN_TASK = -32602
#: The clients' whole run, failover included; the test's own timeout is above it.
RUN_S = 180


@dataclass
class Ledger:
    """What the clients were told, shared by their threads."""

    acknowledged: list[str] = field(default_factory=lambda: [])
    answered: set[str] = field(default_factory=lambda: set())
    #: When each task was created and answered (wall clock, to set beside the Redis and worker logs).
    times: dict[str, list[str]] = field(default_factory=lambda: {})
    vanished: set[str] = field(default_factory=lambda: set())  # acknowledged, then unknown to the server
    acknowledged_before_kill: int = 0  # how many, when the primary was SIGKILLed
    refusals: Counter[str] = field(default_factory=lambda: Counter())
    broken: list[str] = field(default_factory=lambda: [])  # HTTP 5xx, a hang, a reply that is not JSON-RPC
    lock: threading.Lock = field(default_factory=threading.Lock)

    def refused(self, reply: dict[str, Any]) -> None:
        with self.lock:
            self.refusals[str(reply["error"].get("message", ""))[:90]] += 1


@pytest.fixture
def group(tmp_path: Path) -> Iterator[SentinelGroup]:
    sentinels = start_sentinel_group(tmp_path / "redis")
    yield sentinels
    sentinels.stop()


class Stack:
    """The server and a worker on the group, the worker kept running as a process manager would.

    Celery's worker can die of the failover itself: kombu's Sentinel transport, putting back its
    unacked messages as it closes the lost connection, has raised "Unrecoverable error:
    AttributeError('NoneType' object has no attribute 'hostname')" here, and the worker exits.
    Production restarts such a worker (systemd, Kubernetes), so this stack does too, and counts it.
    """

    def __init__(self, group: SentinelGroup, env: dict[str, str], logs: Path, **settings: str) -> None:
        # The store follows the Sentinel result backend unless `settings` name it (MCP_CELERY_REDIS_URL).
        drop = ("MCP_CELERY_REDIS_URL", "TEST_MARKERS_URL", "TEST_CELERY_BACKEND")
        self.env = {k: v for k, v in env.items() if k not in drop} | {
            "TEST_BROKER_URL": group.url_for_db(0),
            "TEST_RESULT_BACKEND": group.url_for_db(1),
            "TEST_SENTINEL_MASTER": MASTER_NAME,
            **settings,
        }
        self.logs, self.name = logs, f"failover-{group.sentinel_ports[0]}"
        self.restarts = 0
        self.worker = self._start_worker()
        self.url, self.server = start_http_server(self.env, logs / "server.log")
        self._stopping = threading.Event()
        self._watch = threading.Thread(target=self._keep_worker_alive, daemon=True)
        self._watch.start()

    def _start_worker(self) -> Process:
        log = self.logs / f"worker-{self.restarts}.log"
        return start_worker(self.env, log, name=self.name, concurrency=6)

    def _keep_worker_alive(self) -> None:
        while not self._stopping.wait(0.5):
            if not self.worker.alive():
                self.restarts += 1
                self.worker = self._start_worker()

    def stop(self) -> None:
        self._stopping.set()
        self._watch.join(90)
        self.server.stop()
        self.worker.stop()


def clock() -> str:
    return datetime.datetime.now().strftime("%H:%M:%S.%f")[:-3]


def call(client: HttpClient, ledger: Ledger, method: str, params: dict[str, Any], **kw: Any) -> dict[str, Any] | int:
    """One request: its result, or the error code when it was refused (recorded), or 0 when broken (recorded)."""
    try:
        reply = client.post(method, params, **kw)
    except (TimeoutError, OSError) as exc:
        with ledger.lock:
            ledger.broken.append(f"{method}: {type(exc).__name__} {exc}")
        client.close()
        return 0
    if reply.status_code >= 500:
        with ledger.lock:
            ledger.broken.append(f"{method}: HTTP {reply.status_code} {reply.text[:200]}")
        return 0
    body = reply.json()
    if "error" in body:
        ledger.refused(body)
        return int(body["error"]["code"])
    return dict(body["result"])


def client_loop(url: str, ledger: Ledger, count: int, deadline: float) -> None:
    """Create `count` tasks one after another and answer each one's question, retrying what is refused."""
    client = HttpClient(url)  # its 30 s socket timeout: a request that outlives it is a hang
    for _ in range(count):
        task_id = None
        while task_id is None and time.monotonic() < deadline:
            params = {"name": "ask_one", "arguments": {"timeout": ANSWER_TIMEOUT_S}}
            result = call(client, ledger, "tools/call", params, capabilities=caps(elicitation={}))
            if not isinstance(result, dict):
                time.sleep(0.2)
                continue
            task_id = str(result["taskId"])
            with ledger.lock:
                ledger.acknowledged.append(task_id)
                ledger.times[task_id] = [f"created {clock()}"]
        while task_id is not None and time.monotonic() < deadline:
            task = call(client, ledger, "tasks/get", {"taskId": task_id})
            if task == UNKNOWN_TASK:  # its record is gone: lost in the failover
                with ledger.lock:
                    ledger.vanished.add(task_id)
                break
            if not isinstance(task, dict) or task["status"] != "input_required":
                if isinstance(task, dict) and task["status"] in TERMINAL_STATUSES:
                    break
                time.sleep(0.05)
                continue
            (key,) = task["inputRequests"]
            answer = {"taskId": task_id, "inputResponses": {key: ACCEPT}}
            if isinstance(call(client, ledger, "tasks/update", answer), dict):
                with ledger.lock:
                    ledger.answered.add(task_id)
                    ledger.times.setdefault(task_id, []).append(f"answered {clock()}")
                break
    client.close()


def run_failover(
    group: SentinelGroup, url: str, *, stall: bool = False
) -> tuple[Ledger, dict[str, dict[str, Any] | None]]:
    """The clients' run with the primary killed a third of the way in; then every acknowledged task's end.

    `stall`: then, once the killed node is back in sync, the new primary stalls (SIGSTOP) until the
    sentinels replace it too, and wakes up a primary still, taking writes it later drops (`SentinelGroup.stall`).
    """
    ledger = Ledger()
    deadline = time.monotonic() + RUN_S
    threads = [
        threading.Thread(target=client_loop, args=(url, ledger, TASKS // CLIENTS, deadline), daemon=True)
        for _ in range(CLIENTS)
    ]
    for thread in threads:
        thread.start()
    wait_for(lambda: len(ledger.acknowledged) >= TASKS // 3, 120, 0.05, "a third of the tasks")
    old = group.primary_port()
    with ledger.lock:
        ledger.acknowledged_before_kill = len(ledger.acknowledged)
    group.kill(old)
    new = wait_for(lambda: (port := group.primary_port()) != old and port, 30, 0.1, "Sentinel to promote the replica")
    group.start_data(old, replica_of=new)  # the killed node returns as the new primary's replica
    if stall:
        wait_for(lambda: group.replica_online(new), 30, 0.1, "the returned node to be in sync")
        group.stall(new)
    for thread in threads:
        thread.join(max(deadline - time.monotonic(), 1))
    assert not any(thread.is_alive() for thread in threads), "the clients did not finish"
    return ledger, final_states(url, ledger.acknowledged)


def final_states(url: str, task_ids: list[str]) -> dict[str, dict[str, Any] | None]:
    """Each task as it ends (None: unknown to the server, its record lost); waits up to a minute for them all."""
    client = HttpClient(url)
    found: dict[str, dict[str, Any] | None] = {}
    deadline = time.monotonic() + 60 + ANSWER_TIMEOUT_S
    pending = list(task_ids)
    while pending and time.monotonic() < deadline:
        for task_id in list(pending):
            reply = client.call("tasks/get", {"taskId": task_id})
            if "error" in reply:
                if reply["error"]["code"] == -32602:
                    found[task_id] = None
                    pending.remove(task_id)
                continue
            if reply["result"]["status"] in TERMINAL_STATUSES:
                found[task_id] = reply["result"]
                pending.remove(task_id)
        time.sleep(0.2)
    client.close()
    for task_id in pending:
        found[task_id] = {"status": "never ended"}
    return found


def summary(ledger: Ledger, ends: dict[str, dict[str, Any] | None]) -> str:
    def outcome(task: dict[str, Any] | None) -> str:
        if task is None:
            return "record lost"
        text = "".join(c.get("text", "") for c in task.get("result", {}).get("content", []))
        if task["status"] == "completed" and task["result"].get("isError"):
            return "InputTimeout" if "InputTimeout" in text else f"tool error: {text[:120]}"
        if task["status"] == "failed":
            return f"failed: {task.get('statusMessage', '')}"
        return f"{task['status']} {text}".strip()

    ends_by = Counter(outcome(task) for task in ends.values())
    refusals = ", ".join(f"{n} x {m!r}" for m, n in ledger.refusals.most_common(4)) or "none"
    vanished = f", {len(ledger.vanished)} gone while the client waited" if ledger.vanished else ""
    lost = ", ".join(f"{n} {what}" for what, n in losses(ledger, ends).items() if n) or "nothing"
    return (
        f"{len(ledger.acknowledged)} tasks acknowledged, {len(ledger.answered)} answered{vanished}; "
        f"ends: {dict(ends_by)}; refused during the switch: {refusals}; lost: {lost}"
    )


def losses(ledger: Ledger, ends: dict[str, dict[str, Any] | None]) -> dict[str, int]:
    """What the run lost that a client had been told was done, by kind, as the note names them."""
    return {
        LOST_RECORDS: sum(task is None for task in ends.values()),
        NEVER_ENDED: sum(task is not None and task["status"] not in TERMINAL_STATUSES for task in ends.values()),
        LOST_ANSWERS: sum("InputTimeout" in str(ends[task_id]) for task_id in ledger.answered),
        LOST_MESSAGES: sum(LOST_BEFORE_START in str((task or {}).get("statusMessage")) for task in ends.values()),
    }


#: The kinds of loss the note names (`losses`).
LOST_RECORDS = "acknowledged task(s) unknown to the server"
NEVER_ENDED = "acknowledged task(s) never ended"
LOST_ANSWERS = "acknowledged answer(s) lost (the job's InputTimeout)"
LOST_MESSAGES = "job message(s) lost before any worker took them (the task failed)"


def waits_sent(ports: list[int]) -> int:
    """How many WAIT commands the Redis servers at `ports` ran since they started (INFO commandstats)."""
    total = 0
    for port in ports:
        client = redis.Redis(port=port, socket_timeout=5)
        try:
            total += int(client.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))
        finally:
            client.close()
    return total


@dataclass
class Run:
    """A failover run: what the clients were told, how each acknowledged task ended, its note, and the
    WAITs the data nodes alive at its end ran (both came into their role at or after the kill)."""

    ledger: Ledger
    ends: dict[str, dict[str, Any] | None]
    note: str
    waits: int

    @property
    def created_after_kill(self) -> int:
        return len(self.ledger.acknowledged) - self.ledger.acknowledged_before_kill


def failover(
    group: SentinelGroup,
    env: dict[str, str],
    logs: Path,
    capsys: pytest.CaptureFixture[str],
    *,
    stall: bool = False,
    **settings: str,
) -> Run:
    """The run on a stack with `settings`; prints its note; every request must have had a clean answer."""
    running = Stack(group, env, logs, **settings)
    try:
        ledger, ends = run_failover(group, running.url, stall=stall)
    finally:
        running.stop()
    waits = waits_sent(list(group.data))
    label = "MIN_REPLICAS=1" if settings.get("MCP_CELERY_REDIS_MIN_REPLICAS") else "no MIN_REPLICAS"
    label += ", then a stalled primary replaced" if stall else ""
    restarted = f"; the Celery worker died and was restarted {running.restarts} time(s)" if running.restarts else ""
    note = f"Sentinel failover, {label}: {summary(ledger, ends)}{restarted}; {waits} WAITs after the kill"
    with capsys.disabled():
        print(f"\n{note}")
    assert not ledger.broken, ledger.broken  # even a lossy run answers every request with JSON-RPC
    assert len(ledger.acknowledged) == TASKS
    return Run(ledger, ends, note, waits)


def assert_replicated_and_nothing_acknowledged_was_lost(run: Run) -> None:
    ledger, ends = run.ledger, run.ends
    # Each task created after the kill waited for its replica (and so did its answer and its job).
    assert run.waits >= run.created_after_kill > 0, run.note
    assert not ledger.vanished, f"acknowledged tasks unknown to the server afterwards: {ledger.vanished}"
    lost = [task_id for task_id, task in ends.items() if task is None or task["status"] not in TERMINAL_STATUSES]
    assert not lost, f"acknowledged tasks gone or never ended: {[(t, ends[t]) for t in lost]}"
    waited_in_vain = [t for t in ledger.answered if "InputTimeout" in str(ends[t])]
    assert not waited_in_vain, f"acknowledged answers lost: {[(t, ledger.times.get(t)) for t in waited_in_vain]}"


@pytest.mark.timeout(RUN_S + 2 * ANSWER_TIMEOUT_S + 120)
def test_with_min_replicas_no_acknowledged_task_or_answer_is_lost_in_a_failover(
    group: SentinelGroup, env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = failover(group, env, tmp_path, capsys, MCP_CELERY_REDIS_MIN_REPLICAS="1")
    assert_replicated_and_nothing_acknowledged_was_lost(run)


@pytest.mark.timeout(RUN_S + 2 * ANSWER_TIMEOUT_S + 120)
def test_with_min_replicas_a_stalled_primary_replaced_while_it_takes_writes_loses_nothing_acknowledged(
    group: SentinelGroup, env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The split brain of a loaded machine: the new primary misses its pings, the sentinels promote the
    other node, and it wakes up taking its clients' writes for seconds before it is told to replicate
    and drops them. Whatever a client was told in that time must hold on the primary that stays."""
    run = failover(group, env, tmp_path, capsys, stall=True, MCP_CELERY_REDIS_MIN_REPLICAS="1")
    assert_replicated_and_nothing_acknowledged_was_lost(run)


@pytest.mark.timeout(RUN_S + 2 * ANSWER_TIMEOUT_S + 120)
def test_without_min_replicas_a_failover_sends_no_wait_and_the_note_says_what_it_lost(
    group: SentinelGroup, env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the run lost (usually nothing on loopback) is printed, not asserted: Redis may lose writes here."""
    # The store named by its own settings this time, as a deployment without a Sentinel result backend would.
    run = failover(
        group, env, tmp_path, capsys, MCP_CELERY_REDIS_URL=group.url_for_db(2), MCP_CELERY_REDIS_MASTER_NAME=MASTER_NAME
    )
    assert run.waits == 0 and run.created_after_kill > 0, run.note  # the setting off: acknowledged on the primary


def test_with_min_replicas_a_task_no_replica_confirmed_is_refused_and_cancelled(
    env: dict[str, str], tmp_path: Path
) -> None:
    """A primary without a replica: `tools/call` is refused with a JSON-RPC error naming the setting, and the
    task it wrote is cancelled (no worker may run it); once a replica follows, the same call is a task."""
    port, primary = start_plain(tmp_path / "primary", "primary")
    base = f"redis://127.0.0.1:{port}"
    drop = ("TEST_MARKERS_URL", "TEST_CELERY_BACKEND")
    own = {k: v for k, v in env.items() if k not in drop} | {
        "MCP_CELERY_REDIS_URL": f"{base}/0",
        "TEST_BROKER_URL": f"{base}/1",  # no worker takes the jobs: what is written is all there is
        "TEST_RESULT_BACKEND": f"{base}/2",
        "MCP_CELERY_REDIS_MIN_REPLICAS": "1",
        "MCP_CELERY_REDIS_MIN_REPLICAS_WAIT_MS": "200",
    }
    records = redis.Redis(port=port, db=0)
    replica = server = None
    client: HttpClient | None = None
    try:
        url, server = start_http_server(own, tmp_path / "server.log")
        client = HttpClient(url)
        refused = client.call("tools/call", {"name": "echo", "arguments": {"text": "unconfirmed"}})
        assert "error" in refused and refused["error"]["code"] == INTERNAL_ERROR, refused
        message = refused["error"]["message"]
        assert "0 of the 1 replicas" in message and "MCP_CELERY_REDIS_MIN_REPLICAS" in message, message
        assert "cancelled" in message, message
        (written,) = records.keys("mcp-celery:task:*}")  # the one record the refused call wrote
        assert b"cancelled" in (records.hget(written, "final") or b""), records.hgetall(written)
        assert waits_sent([port]) >= 1

        _, replica = start_plain(tmp_path / "replica", "replica", "--replicaof", "127.0.0.1", str(port))
        wait_for(lambda: records.execute_command("WAIT", 1, 100) == 1, 20, 0.1, "the replica to confirm writes")
        task_id = client.start("echo", {"text": "confirmed"})
        assert client.get(task_id)["status"] == "working"  # acknowledged: queued, no worker here
    finally:
        if client is not None:
            client.close()
        if server is not None:
            server.stop()
        if replica is not None:
            replica.stop()
        records.close()
        primary.stop()


def test_the_note_names_each_kind_of_loss_with_its_count() -> None:
    """A run that lost some of each kind, as the ledger and the ends would show it (no failover needed);
    the note written out by hand."""
    ledger = Ledger(acknowledged=[f"t{i}" for i in range(TASKS)], answered={"t1", "t2", "t3"}, vanished={"t0"})
    ledger.refusals.update({"the task store (Redis) is unavailable right now": 3, "could not queue the job": 1})
    completed = {"status": "completed", "result": {"content": [{"type": "text", "text": "ok"}]}}
    ends: dict[str, dict[str, Any] | None] = dict.fromkeys(ledger.acknowledged, completed)
    ends["t0"] = None  # the record is gone
    timed_out = {
        "status": "completed",
        "result": {"isError": True, "content": [{"type": "text", "text": "InputTimeout"}]},
    }
    ends["t1"] = ends["t2"] = timed_out  # answered, yet the job waited in vain
    ends["t4"] = ends["t5"] = ends["t6"] = {"status": "never ended"}
    ends["t7"] = {"status": "failed", "statusMessage": f"{LOST_BEFORE_START} (the broker lost it)"}
    assert summary(ledger, ends) == (
        "200 tasks acknowledged, 3 answered, 1 gone while the client waited; "
        "ends: {'record lost': 1, 'InputTimeout': 2, 'completed ok': 193, 'never ended': 3, "
        '"failed: the job\'s message was lost before any worker started it (the broker lost it)": 1}; '
        "refused during the switch: 3 x 'the task store (Redis) is unavailable right now', "
        "1 x 'could not queue the job'; "
        "lost: 1 acknowledged task(s) unknown to the server, 3 acknowledged task(s) never ended, "
        "2 acknowledged answer(s) lost (the job's InputTimeout), "
        "1 job message(s) lost before any worker took them (the task failed)"
    )


def test_a_run_that_lost_nothing_says_so() -> None:
    ledger = Ledger(acknowledged=["a", "b"], answered={"a"})
    completed = {"status": "completed", "result": {"content": [{"type": "text", "text": "ok"}]}}
    assert summary(ledger, {"a": completed, "b": completed}) == (
        "2 tasks acknowledged, 1 answered; ends: {'completed ok': 2}; refused during the switch: none; lost: nothing"
    )
