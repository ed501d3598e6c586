"""The chaos run's verdict: is every task's end consistent with what happened to it, and the summary table.

A parking job (`PARK_TOOLS`) is judged on its own terms. Not hit by a kill, it runs once plus once
per time it parked (the workers' logs say when), and never more than once per question (plus the
reruns of an at-least-once one hit by kills). It ends `completed` with its own answers to each of its
questions and the value its `ctx.once` work returned, `cancelled` only if cancelled, or `failed` as a
lost or stopped worker's task: a kill hit one of its runs, or a kill came after its first answer (the
resumed message may have been taken by the killed worker). Its `ctx.once` work runs again only after a
call of it that a chaos event cut short: each call but the last was in a process killed (or, for an
at-least-once job, while Redis restarted) between that call's start and the next call's, where a
worker's SIGTERM lasts until it exited and a Redis restart until Redis was back (and Celery may see
the lost connection up to `KILL_STAMP_S` later).
"""

from __future__ import annotations

import itertools
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.chaos.cluster import SETTINGS
from tests.support.chaos.run import AT_LEAST_ONCE, KINDS, PARK_TOOLS, Chaos, Kill, Tracked, answer_value

#: How many times an at-least-once job may run again (retry_on_worker_loss=True).
RETRIES = 3
#: The only reasons a task may fail in this run: its worker (or job process) was lost or shut down.
FAILURE_REASONS = ("lost", "shut down")
#: A job that parked (`mcp_celery.worker.context`), in its worker's log.
PARKED_LINE = re.compile(r"task (\S+): parked until answered")
#: Slack (s) between a chaos event's wall-clock stamps and its effect on a job (the driver stamps a kill
#: after the signal; Celery notices a Redis restart at its next broker read).
KILL_STAMP_S = 1.0


@dataclass
class Verdict:
    problems: list[str] = field(default_factory=lambda: [])
    stuck: list[str] = field(default_factory=lambda: [])
    table: str = ""
    counts: dict[str, int] = field(default_factory=lambda: {})


def evaluate(chaos: Chaos) -> Verdict:
    verdict = Verdict(problems=list(chaos.problems), counts=dict(chaos.counts))
    runs = Counter(run["task"] for run in chaos.runs)
    killed = {pid for kill in chaos.kills for pid in kill.pids}
    hit = {run["task"] for run in chaos.runs if run["pid"] in killed or run["worker"] in killed}
    hit |= {t for kill in chaos.kills for t in kill.tasks}
    parks = log_counts(chaos.cluster.folder, "w", PARKED_LINE)
    onces: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for call in chaos.onces:
        onces[call["task"]].append(call)
    for task in chaos.tasks.values():
        parking = task.kind in PARK_TOOLS
        if parking:
            ran = _park_runs(task, runs[task.task_id], parks[task.task_id], task.task_id in hit)
            if ran:
                verdict.problems.append(f"{task.task_id} ({task.kind}): {ran}")
            again = _once_again(chaos, task, onces[task.task_id])
            if again:
                verdict.problems.append(f"{task.task_id} ({task.kind}): {again}")
        elif runs[task.task_id] > (1 if task.kind != "retry" else 1 + RETRIES) or (
            runs[task.task_id] > 1 and task.task_id not in hit
        ):
            verdict.problems.append(f"{task.task_id} ({task.kind}) ran {runs[task.task_id]} times")
        if task.asked_again:
            verdict.problems.append(f"{task.task_id}: answered, yet asked again {task.asked_again} time(s)")
        if task.final is None:
            verdict.stuck.append(_stuck_line(chaos, task, runs[task.task_id]))
            continue
        if parking:
            hit_or_resume_hit = task.task_id in hit or _killed_after_answer(chaos, task)
            problem = _check_park_final(task, runs[task.task_id], hit_or_resume_hit, onces[task.task_id])
        else:
            problem = _check_final(task, runs[task.task_id], task.task_id in hit)
        if problem:
            verdict.problems.append(f"{task.task_id} ({task.kind}): {problem}: {task.final}")
    verdict.counts |= _parking_counts(chaos, parks, runs, onces)
    verdict.counts["cancelled"] = sum(1 for t in chaos.tasks.values() if t.final and t.final["status"] == "cancelled")
    if verdict.stuck:
        verdict.stuck.append(f"(messages left in the broker queue and kombu's unacked hash: {chaos.cluster.queued()})")
    verdict.table = table(chaos, verdict)
    return verdict


def _check_final(task: Tracked, runs: int, hit: bool) -> str | None:
    final = task.final or {}
    status = final["status"]
    if status == "cancelled":
        return None if task.cancel_sent is not None else "cancelled, but never cancelled by the test"
    if status == "completed":
        text = final.get("result", {}).get("content", [{}])[0].get("text", "")
        want = {"sleep": f"slept {task.task_id}", "retry": f"again {task.task_id}"}.get(
            task.kind, f"{task.task_id}:{task.answered}"
        )
        if final.get("result", {}).get("isError") or text != want:
            return f"completed with {text!r}, expected {want!r}"
        return None if runs == 1 or task.kind == "retry" else f"completed after {runs} runs"
    message = str(final.get("statusMessage", ""))
    if not any(reason in message for reason in FAILURE_REASONS):
        return "failed for a reason other than a lost or stopped worker"
    if not hit and runs > 0:
        return "failed, but no process running it was killed or stopped"
    return None


def log_counts(folder: Path, prefix: str, line: re.Pattern[str]) -> Counter[str]:
    """How many times each task id appears in `line` in the logs of the processes named `prefix...`."""
    found: Counter[str] = Counter()
    for path in sorted(folder.glob(f"{prefix}*.log")):
        found.update(match.group(1) for match in line.finditer(path.read_text(errors="replace")))
    return found


def _park_runs(task: Tracked, runs: int, parks: int, hit: bool) -> str | None:
    """A parking job runs once, then once per park; more only if a kill hit a run (at-least-once)."""
    limit = 1 + task.questions + (RETRIES if task.kind in AT_LEAST_ONCE else 0)
    if runs > limit:
        return f"ran {runs} times (at most {limit})"
    if not hit and runs > 1 + parks:
        return f"ran {runs} times, yet parked {parks} time(s) and no kill hit it"
    return None


def _killed_after_answer(chaos: Chaos, task: Tracked) -> bool:
    """Whether a process was killed or stopped between the task's first answer and its end.

    A resumed job's message taken by a worker killed before the job started ends the task failed
    (at-most-once), though no run of it shows the worker's pid.
    """
    if not task.answer_times:
        return False
    end = task.final_at if task.final_at is not None else float("inf")
    return any(kill.pids and task.answer_times[0] <= kill.at <= end for kill in chaos.kills)


def _check_park_final(task: Tracked, runs: int, hit: bool, onces: list[dict[str, Any]]) -> str | None:
    final = task.final or {}
    status = final["status"]
    if status == "cancelled":
        return None if task.cancel_sent is not None else "cancelled, but never cancelled by the test"
    if status == "completed":
        text = final.get("result", {}).get("content", [{}])[0].get("text", "")
        answers = "+".join(answer_value(task.task_id, f"elicit-{number + 1}") for number in range(task.questions))
        found = re.fullmatch(rf"{re.escape(task.task_id)}:built-(\d+):{re.escape(answers)}", text)
        if final.get("result", {}).get("isError") or found is None:
            return f"completed with {text!r}, expected '{task.task_id}:built-<pid>:{answers}'"
        if int(found.group(1)) not in {call["pid"] for call in onces}:
            return "completed with a ctx.once value that no logged call of its work returned"
        return None
    message = str(final.get("statusMessage", ""))
    if not any(reason in message for reason in FAILURE_REASONS):
        return "failed for a reason other than a lost or stopped worker"
    if not hit and runs > 0:
        return "failed, but no process running it was killed or stopped, nor any after its answer"
    return None


def _once_again(chaos: Chaos, task: Tracked, calls: list[dict[str, Any]]) -> str | None:
    """A second call of the job's ctx.once work not explained by a chaos event cutting the call before it short."""
    ordered = sorted(calls, key=lambda call: call["t"])
    for call, later in itertools.pairwise(ordered):
        if not any(_cut(kill, task, call, later["t"]) for kill in chaos.kills):
            return (
                f"its ctx.once work ran again (pid {later['pid']} at {later['t']:.2f}) though nothing stopped "
                f"the call before it (pid {call['pid']} at {call['t']:.2f})"
            )
    return None


def _cut(kill: Kill, task: Tracked, call: dict[str, Any], until: float) -> bool:
    """Whether `kill` may have stopped `call` (of ctx.once's work) before its value was stored: it
    happened (or lasted) between the call's start and the next call's."""
    ended = kill.wall if kill.wall_end is None else kill.wall_end
    if not (kill.wall <= until + KILL_STAMP_S and call["t"] <= ended + KILL_STAMP_S):
        return False
    if kill.kind == "redis_restart":
        return task.kind in AT_LEAST_ONCE  # Celery stops late-ack jobs then (see Chaos._redis_restart)
    return call["pid"] in kill.pids or call["worker"] in kill.pids


def _parking_counts(
    chaos: Chaos, parks: Counter[str], runs: Counter[str], onces: dict[str, list[dict[str, Any]]]
) -> dict[str, int]:
    parking = [task for task in chaos.tasks.values() if task.kind in PARK_TOOLS]
    resumed = [t for t in parking if t.final and t.final["status"] == "completed" and runs[t.task_id] > 1]
    return {
        "parks": sum(parks.values()),
        "resumed_completed": len(resumed),
        "once_calls": sum(len(calls) for calls in onces.values()),
        "once_tasks": sum(1 for calls in onces.values() if calls),
    }


def _stuck_line(chaos: Chaos, task: Tracked, runs: int) -> str:
    created = task.created - chaos.started
    near = [f"{k.kind}@{k.at - chaos.started:.1f}s" for k in chaos.kills if abs(k.at - task.created) < 5]
    return (
        f"{task.task_id} {task.kind} status={task.status} runs={runs} created@{created:.1f}s "
        f"cancel_sent={task.cancel_sent is not None} answered={task.answered is not None} kills_near={near}"
        + (f" answers={len(task.answers)}/{task.questions}" if task.kind in PARK_TOOLS else "")
    )


def detection_delays(chaos: Chaos) -> dict[str, float]:
    """Worst time per kind from a kill (or the end of the shutdown grace) to a task of it seen failed.

    At-most-once tasks only: an at-least-once task hit by a kill runs again, and if it fails in
    the end (lost too often, or its message with its worker), that is runs later, not detection.
    """
    grace = float(SETTINGS["MCP_CELERY_SHUTDOWN_GRACE_S"])
    worst: dict[str, float] = {}
    for kill in chaos.kills:
        start = kill.at + (grace if kill.kind == "worker_restart" else 0)
        for task_id in kill.tasks:
            task = chaos.tasks[task_id]
            if task.kind in AT_LEAST_ONCE:
                continue
            if task.final is not None and task.final["status"] == "failed" and task.final_at is not None:
                worst[kill.kind] = max(worst.get(kill.kind, 0.0), task.final_at - start)
    return worst


def table(chaos: Chaos, verdict: Verdict) -> str:
    outcomes = Counter(t.final["status"] if t.final else f"stuck {t.status}" for t in chaos.tasks.values())
    parking = Counter(
        t.final["status"] if t.final else f"stuck {t.status}" for t in chaos.tasks.values() if t.kind in PARK_TOOLS
    )
    kinds = Counter(t.kind for t in chaos.tasks.values())
    runs = Counter(Counter(run["task"] for run in chaos.runs).values())
    never = sum(1 for t in chaos.tasks if t not in {run["task"] for run in chaos.runs})
    delays = detection_delays(chaos)
    affected = sum(len(k.tasks) for k in chaos.kills)
    rows = [
        ("seed", str(chaos.seed)),
        ("chaos time", f"{chaos.plan.duration_s:.0f} s, {chaos.plan.in_flight} tasks in flight"),
        ("phases", ", ".join(f"{name} {seconds:.1f} s" for name, seconds in chaos.phases.items())),
        ("tasks", f"{len(chaos.tasks)} ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})"),
        ("create failures", str(chaos.counts["create_failed"])),
        *[(f"  {kind}", str(chaos.counts[kind])) for kind in KINDS],
        ("process starts", ", ".join(f"{name} {n}" for name, n in sorted(chaos.cluster.starts.items()))),
        ("tasks running at a kill", str(affected)),
        ("cancels sent", str(chaos.counts["cancels"])),
        ("answers sent", str(chaos.counts["answers"])),
        (
            "parking answers sent",
            f"{chaos.counts['park_answers']}, {chaos.counts['park_answers_worker_down']} "
            "of them while a worker was down or stopping",
        ),
        (
            "parks",
            f"{verdict.counts['parks']} (worker logs); {verdict.counts['resumed_completed']} parking task(s) "
            "completed after a resume",
        ),
        ("parking outcomes", ", ".join(f"{status} {n}" for status, n in sorted(parking.items()))),
        ("ctx.once work", f"{verdict.counts['once_calls']} call(s) for {verdict.counts['once_tasks']} task(s)"),
        *[(f"  outcome {status}", str(n)) for status, n in sorted(outcomes.items())],
        ("executions", f"{', '.join(f'{n} task(s) ran {k}x' for k, n in sorted(runs.items()))}; never ran {never}"),
        *[(f"  worst detection {kind}", f"{delay:.2f} s") for kind, delay in sorted(delays.items())],
        ("worst detection delay", f"{max(delays.values(), default=0.0):.2f} s"),
        ("problems", str(len(verdict.problems))),
        ("stuck", str(len(verdict.stuck))),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"| {name.ljust(width)} | {value} |" for name, value in rows)
