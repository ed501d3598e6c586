"""The chaos driver: keeps N tasks in flight while it kills, restarts, cancels and answers at random.

One thread, no fixed sleeps: each turn it tops up the tasks in flight, reads every open task once
(answering and cancelling as planned), reads the executions log, and performs the chaos events
that are due. Parking jobs (`PARK_TOOLS`) are answered a random moment after they ask, cancelled
ones too (the cancel races the answer), and half of those waiting get their answer at the moment
a worker is killed or stopped. Restarted processes are only spawned; until they answer, calls go to the other
server. Every decision comes from one seeded RNG (the timing of real processes still varies).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from mcp_celery.protocol import TERMINAL_STATUSES, client_capabilities
from mcp_celery.testing.jsonrpc import RawHttpClient
from tests.support.chaos.cluster import Cluster
from tests.support.chaos.jobs import ONCE_KEY, RUNS_KEY

#: The shortest turn of the driver's loop (a polling interval, not a synchronization).
TURN_S = 0.05
#: How long a worker may take to exit after SIGTERM (grace 2 s, then Celery's cold shutdown).
SHUTDOWN_LIMIT_S = 20.0
KINDS = ("worker_kill", "child_kill", "worker_restart", "server_kill", "redis_restart")
#: The parking kinds and their tools: park windows 0 and 1 s, and 0.5 s at-least-once (`tests.support.chaos.jobs`).
PARK_TOOLS = {"park0": "chaos_park", "park1": "chaos_park_late", "park_retry": "chaos_park_retry"}
#: The kinds delivered at least once (retry_on_worker_loss): they may run again after a kill.
AT_LEAST_ONCE = ("retry", "park_retry")
#: How long the driver takes at most to answer a parking job's question (some answers come within the
#: park window, most after the job parked).
PARK_ANSWER_S = 3.0
INPUT = "input_required"


def answer_value(task_id: str, key: str) -> str:
    """The value the driver answers the task's question `key` with (the job returns each, in order)."""
    return f"v-{task_id[:8]}-{key}"


@dataclass
class Tracked:
    """One task as the driver saw it."""

    task_id: str
    kind: str  # "sleep", "ask", "retry" (at-least-once) or a parking kind (PARK_TOOLS)
    created: float
    cancel_after: float | None = None
    questions: int = 0  # a parking job's
    status: str = "working"
    answer_due: float | None = None
    cancel_sent: float | None = None
    answered: str | None = None
    asked_again: int = 0  # input_required seen after an answer was accepted: a lost answer
    final: dict[str, Any] | None = None
    final_at: float | None = None
    #: A parking job's questions answered (wire key -> value, as accepted), and when (monotonic).
    answers: dict[str, str] = field(default_factory=lambda: {})
    answer_times: list[float] = field(default_factory=lambda: [])


@dataclass
class Kill:
    """One chaos event that stops processes, and the open tasks then running in them."""

    kind: str
    at: float
    pids: set[int]
    tasks: set[str] = field(default_factory=lambda: set())
    #: When, by the wall clock (the jobs' logs are stamped so).
    wall: float = field(default_factory=time.time)
    #: When it was over, by the wall clock, for an event that lasts (a worker's shutdown until it
    #: exited, a Redis restart until Redis was back); None: at once.
    wall_end: float | None = None


@dataclass
class Plan:
    """What the run does: sizes and durations (the short test and the long run differ only here)."""

    in_flight: int = 200
    duration_s: float = 600
    concurrency: int = 6
    max_sleep_s: float = 8.0
    event_gap_s: tuple[float, float] = (3.0, 8.0)
    ask_share: float = 0.3
    #: At-least-once jobs (retry_on_worker_loss): they may run again, but only after a kill.
    retry_share: float = 0.15
    #: Jobs that park at their questions (one or two), evenly of the PARK_TOOLS kinds.
    park_share: float = 0.3
    cancel_share: float = 0.15
    #: The chaos events drawn from.
    kinds: tuple[str, ...] = KINDS


class Chaos:
    def __init__(self, cluster: Cluster, plan: Plan, seed: int) -> None:
        self.cluster = cluster
        self.plan = plan
        self.seed = seed
        self.rng = random.Random(seed)
        self.clients = [RawHttpClient(url, timeout=15, client_name="mcp-celery-chaos") for url in cluster.urls]
        self.tasks: dict[str, Tracked] = {}
        self.open: set[str] = set()
        self.runs: list[dict[str, Any]] = []
        self.onces: list[dict[str, Any]] = []  # each call of a parking job's ctx.once work (ONCE_KEY)
        self.kills: list[Kill] = []
        self.counts: dict[str, int] = dict.fromkeys(KINDS, 0) | {
            "create_failed": 0,
            "cancels": 0,
            "answers": 0,
            "park_answers": 0,
            "park_answers_worker_down": 0,
        }
        self.pending: list[tuple[float, str, Callable[[], bool]]] = []
        #: Problems of the processes themselves (found while running, not in the tasks' ends).
        self.problems: list[str] = []
        self.stopping: set[str] = set()
        self.started = time.monotonic()
        #: Seconds spent starting the cluster, in chaos and settling afterwards.
        self.phases: dict[str, float] = {}
        self.creating = True
        self._queue = list(plan.kinds)  # every kind once first (in a seeded order), then at random
        self.rng.shuffle(self._queue)
        self._next_event = self.started + self.rng.uniform(*plan.event_gap_s)
        self._runs_db = cluster.runs_db()

    # ------------------------------------------------------------------ calls

    def call(self, method: str, params: dict[str, Any], **caps: Any) -> dict[str, Any] | None:
        """The result from whichever live server answers first, or None (both down, Redis restarting)."""
        order = [i for i, proc in enumerate(self.cluster.servers) if proc is not None]
        self.rng.shuffle(order)
        for index in order:
            client = self.clients[index]
            try:
                reply = client.call(method, params, capabilities=client_capabilities(**caps))
            except (OSError, ValueError):
                client.close()
                continue
            if "result" in reply:
                return dict(reply["result"])
        return None

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        end = self.started + self.plan.duration_s
        while time.monotonic() < end:
            self.turn()
        self.creating = False
        self.phases["chaos"] = time.monotonic() - self.started

    def turn(self) -> None:
        began = time.monotonic()
        self._turn()
        if time.monotonic() - began < TURN_S:
            # Nothing answered (every server down or starting): poll again shortly, not in a hot loop.
            time.sleep(TURN_S)

    def _turn(self) -> None:
        if self.creating:
            self._fill()
        self._sweep()
        self._read_runs()
        self._do_pending(time.monotonic())
        if self.creating and time.monotonic() >= self._next_event:
            self._event()

    def settle(self, timeout: float) -> None:
        """Bring every process back, then go on reading and answering until no task is open or `timeout` passes."""
        self.creating = False
        deadline = time.monotonic() + timeout
        while self.pending and time.monotonic() < deadline:
            self._do_pending(float("inf"))
            self._sweep()
        while self.open and time.monotonic() < deadline:
            self.turn()
        self._read_runs()
        self.phases["settle"] = time.monotonic() - deadline + timeout

    def _fill(self) -> None:
        for _ in range(min(self.plan.in_flight - len(self.open), 20)):
            kind = self._draw_kind()
            cancel_after = self.rng.uniform(0, 3) if self.rng.random() < self.plan.cancel_share else None
            questions = 0
            if kind == "ask":
                result = self.call("tools/call", {"name": "chaos_ask", "arguments": {}}, elicitation={})
            elif kind in PARK_TOOLS:
                questions = self.rng.choice((1, 2))
                arguments = {"work_s": round(self.rng.uniform(0.1, 1.5), 2), "questions": questions}
                result = self.call("tools/call", {"name": PARK_TOOLS[kind], "arguments": arguments}, elicitation={})
            else:
                seconds = round(self.rng.uniform(0.2, self.plan.max_sleep_s), 2)
                tool = "chaos_retry" if kind == "retry" else "chaos_sleep"
                result = self.call("tools/call", {"name": tool, "arguments": {"seconds": seconds}})
            if result is None or "taskId" not in result:
                self.counts["create_failed"] += 1
                return  # no server can take it now; the next turn tries again
            task_id = str(result["taskId"])
            self.tasks[task_id] = Tracked(task_id, kind, time.monotonic(), cancel_after, questions)
            self.open.add(task_id)

    def _draw_kind(self) -> str:
        draw = self.rng.random()
        for kind, share in (("ask", self.plan.ask_share), ("retry", self.plan.retry_share)):
            if draw < share:
                return kind
            draw -= share
        return self.rng.choice(sorted(PARK_TOOLS)) if draw < self.plan.park_share else "sleep"

    def _sweep(self) -> None:
        for task_id in sorted(self.open):
            task = self.tasks[task_id]
            view = self.call("tasks/get", {"taskId": task_id})
            now = time.monotonic()
            if view is not None:
                self._observe(task, view, now)
            if task_id in self.open and self._cancel_due(task, now):
                if self.call("tasks/cancel", {"taskId": task_id}) is not None:
                    task.cancel_sent = time.monotonic()
                    self.counts["cancels"] += 1

    @staticmethod
    def _cancel_due(task: Tracked, now: float) -> bool:
        return task.cancel_after is not None and task.cancel_sent is None and now >= task.created + task.cancel_after

    def _observe(self, task: Tracked, view: dict[str, Any], now: float) -> None:
        task.status = str(view["status"])
        if task.status in TERMINAL_STATUSES:
            task.final, task.final_at = view, now
            self.open.discard(task.task_id)
            return
        if task.status != "input_required":
            return
        if task.kind in PARK_TOOLS:
            self._answer_park(task, view, now)
            return
        if task.cancel_after is not None:
            return
        if task.answered is not None:
            task.asked_again += 1  # the answer was accepted, yet the job asks again: it was lost
        elif task.answer_due is None:
            task.answer_due = now + self.rng.uniform(0, 1.5)
        if task.answered is None and now < (task.answer_due or now):
            return
        value = f"v-{task.task_id[:8]}"
        responses = {key: {"action": "accept", "content": {"value": value}} for key in view.get("inputRequests", {})}
        if self.call("tasks/update", {"taskId": task.task_id, "inputResponses": responses}) is not None:
            task.answered = value
            self.counts["answers"] += 1

    def _answer_park(self, task: Tracked, view: dict[str, Any], now: float) -> None:
        """Answer a parking job's open question a random moment (up to PARK_ANSWER_S) after seeing it.

        Cancelled ones too: a cancel then races the answer and the resume. `_answer_soon` brings
        some answers forward to the moment a worker is killed or stopped.
        """
        keys = sorted(view.get("inputRequests", {}))
        if not keys:
            return
        if any(key in task.answers for key in keys):
            task.asked_again += 1  # an accepted answer asked for again: it was lost
            return
        if task.answer_due is None:
            task.answer_due = now + self.rng.uniform(0, PARK_ANSWER_S)
        if now < task.answer_due:
            return
        values = {key: answer_value(task.task_id, key) for key in keys}
        responses = {key: {"action": "accept", "content": {"value": value}} for key, value in values.items()}
        if self.call("tasks/update", {"taskId": task.task_id, "inputResponses": responses}) is None:
            return
        task.answers.update(values)
        task.answer_times.append(time.monotonic())
        task.answer_due = None
        task.answered = values[keys[-1]]
        self.counts["park_answers"] += 1
        if self.stopping or any(self.cluster.worker_pid(name) is None for name in self.cluster.workers):
            self.counts["park_answers_worker_down"] += 1

    def _answer_soon(self) -> None:
        """Half the parking jobs whose answer is due later get it now, as a worker has just gone."""
        now = time.monotonic()
        for task_id in sorted(self.open):
            task = self.tasks[task_id]
            if task.kind in PARK_TOOLS and task.answer_due is not None and self.rng.random() < 0.5:
                task.answer_due = now

    def _read_runs(self) -> None:
        for key, log in ((RUNS_KEY, self.runs), (ONCE_KEY, self.onces)):
            try:
                raw = self._runs_db.lrange(key, len(log), -1)
            except (redis.RedisError, OSError):
                return
            log.extend(json.loads(entry) for entry in raw)

    # ------------------------------------------------------------------ chaos events

    def _do_pending(self, now: float) -> None:
        due = [item for item in self.pending if item[0] <= now]
        for item in due:
            if item[2]():
                self.pending.remove(item)

    def _event(self) -> None:
        kind = self._queue.pop(0) if self._queue else self.rng.choice(self.plan.kinds)
        if getattr(self, f"_{kind}")():
            self.counts[kind] += 1
        else:
            self._queue.append(kind)  # not possible right now (e.g. a worker is down): try it again later
        self._next_event = time.monotonic() + self.rng.uniform(*self.plan.event_gap_s)

    def _up_workers(self) -> list[str]:
        """Workers running and not shutting down (a stopping worker is never chosen again)."""
        names = [name for name in self.cluster.workers if name not in self.stopping]
        return [name for name in names if self.cluster.worker_pid(name) is not None]

    def _running_on(self, pids: set[int], *, worker: bool) -> set[str]:
        latest = {run["task"]: run for run in self.runs}
        running = {t for t, run in latest.items() if t in self.open and run["worker" if worker else "pid"] in pids}
        # A parking job seen asking holds no process (parked, or about to): its last run was not hit.
        return {
            t for t in running if not (self.tasks[t].kind in PARK_TOOLS and self.tasks[t].status == "input_required")
        }

    def _worker_kill(self) -> bool:
        up = self._up_workers()
        if len(up) < 2:
            return False  # keep one worker up, so that work goes on
        name = self.rng.choice(up)
        self._read_runs()
        pid = self.cluster.kill_worker(name)
        self.kills.append(Kill("worker_kill", time.monotonic(), {pid}, self._running_on({pid}, worker=True)))
        self._restart_later(name, self.rng.uniform(0.5, 3))
        self._answer_soon()
        return True

    def _child_kill(self) -> bool:
        self._read_runs()
        live = {self.cluster.worker_pid(name) for name in self.cluster.workers} - {None}
        killed = {pid for kill in self.kills for pid in kill.pids}
        latest = {run["task"]: run for run in self.runs}
        candidates = sorted(
            run["pid"]
            for t, run in latest.items()
            if t in self.open and run["worker"] in live and run["pid"] not in killed
        )
        if not candidates:
            return False
        pid = self.rng.choice(candidates)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        self.kills.append(Kill("child_kill", time.monotonic(), {pid}, self._running_on({pid}, worker=False)))
        return True

    def _worker_restart(self) -> bool:
        up = self._up_workers()
        if len(up) < 2:
            return False
        name = self.rng.choice(up)
        self._read_runs()
        pid = self.cluster.terminate_worker(name)
        self.stopping.add(name)
        stopped = time.monotonic()
        kill = Kill("worker_restart", stopped, {pid}, self._running_on({pid}, worker=True))
        self.kills.append(kill)
        self._answer_soon()

        def restart() -> bool:
            if not self.cluster.reap_worker(name):
                if time.monotonic() - stopped < SHUTDOWN_LIMIT_S:
                    return False
                # A warm shutdown that never ends is a bug of its own: report it, then go on.
                self.problems.append(f"worker {name} (pid {pid}) still running {SHUTDOWN_LIMIT_S:.0f} s after SIGTERM")
                self.problems.append(self.cluster.log_tail(name))
                self.cluster.kill_worker(name)
            kill.wall_end = time.time()  # its jobs ran on until now (the shutdown grace, then a cold stop)
            self.cluster.start_worker(name)
            self.stopping.discard(name)
            return True

        self.pending.append((time.monotonic(), f"restart {name}", restart))
        return True

    def _restart_later(self, name: str, delay: float) -> None:
        def restart() -> bool:
            self.cluster.start_worker(name)
            return True

        self.pending.append((time.monotonic() + delay, f"restart {name}", restart))

    def _server_kill(self) -> bool:
        up = [i for i, proc in enumerate(self.cluster.servers) if proc is not None]
        if len(up) < 2:
            return False
        index = self.rng.choice(up)
        self.cluster.kill_server(index)

        def restart() -> bool:
            self.cluster.start_server(index)
            return True

        self.pending.append((time.monotonic() + self.rng.uniform(0.5, 3), f"restart server {index}", restart))
        return True

    def _redis_restart(self) -> bool:
        # Celery stops a late-ack (at-least-once) job when its broker connection drops, so every
        # open at-least-once task may be hit, as by a kill (one that starts in the instant before
        # the restart is not in the runs list yet); at-most-once jobs run on through the outage.
        retried = {t for t in self.open if self.tasks[t].kind in AT_LEAST_ONCE}
        kill = Kill("redis_restart", time.monotonic(), set(), retried)
        self.kills.append(kill)
        self.cluster.restart_redis()
        kill.wall_end = time.time()
        return True
