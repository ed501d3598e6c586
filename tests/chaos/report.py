"""The chaos run's verdict: is every task's end consistent with what happened to it, and the summary table."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from tests.chaos.cluster import SETTINGS
from tests.chaos.run import KINDS, Chaos, Tracked

#: How many times an at-least-once job may run again (retry_on_worker_loss=True).
RETRIES = 3
#: The only reasons a task may fail in this run: its worker (or job process) was lost or shut down.
FAILURE_REASONS = ("lost", "shut down")


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
    for task in chaos.tasks.values():
        if runs[task.task_id] > (1 if task.kind != "retry" else 1 + RETRIES) or (
            runs[task.task_id] > 1 and task.task_id not in hit
        ):
            verdict.problems.append(f"{task.task_id} ({task.kind}) ran {runs[task.task_id]} times")
        if task.asked_again:
            verdict.problems.append(f"{task.task_id}: answered, yet asked again {task.asked_again} time(s)")
        if task.final is None:
            verdict.stuck.append(_stuck_line(chaos, task, runs[task.task_id]))
            continue
        problem = _check_final(task, runs[task.task_id], task.task_id in hit)
        if problem:
            verdict.problems.append(f"{task.task_id} ({task.kind}): {problem}: {task.final}")
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


def _stuck_line(chaos: Chaos, task: Tracked, runs: int) -> str:
    created = task.created - chaos.started
    near = [f"{k.kind}@{k.at - chaos.started:.1f}s" for k in chaos.kills if abs(k.at - task.created) < 5]
    return (
        f"{task.task_id} {task.kind} status={task.status} runs={runs} created@{created:.1f}s "
        f"cancel_sent={task.cancel_sent is not None} answered={task.answered is not None} kills_near={near}"
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
            if task.kind == "retry":
                continue
            if task.final is not None and task.final["status"] == "failed" and task.final_at is not None:
                worst[kill.kind] = max(worst.get(kill.kind, 0.0), task.final_at - start)
    return worst


def table(chaos: Chaos, verdict: Verdict) -> str:
    outcomes = Counter(t.final["status"] if t.final else f"stuck {t.status}" for t in chaos.tasks.values())
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
        *[(f"  outcome {status}", str(n)) for status, n in sorted(outcomes.items())],
        ("executions", f"{', '.join(f'{n} task(s) ran {k}x' for k, n in sorted(runs.items()))}; never ran {never}"),
        *[(f"  worst detection {kind}", f"{delay:.2f} s") for kind, delay in sorted(delays.items())],
        ("worst detection delay", f"{max(delays.values(), default=0.0):.2f} s"),
        ("problems", str(len(verdict.problems))),
        ("stuck", str(len(verdict.stuck))),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"| {name.ljust(width)} | {value} |" for name, value in rows)
