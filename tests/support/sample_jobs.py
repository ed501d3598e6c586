"""Jobs the test suite runs on a real worker. Each exists to show one behaviour."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from celery import Celery, chain, group, signals
from celery.exceptions import SoftTimeLimitExceeded
from celery.worker.request import Request
from pydantic import BaseModel
from typing_extensions import TypedDict

import mcp_celery
from mcp_celery.store.connect import redis_target, sync_client

BROKER = os.environ.get("TEST_BROKER_URL", "redis://127.0.0.1:6379/12")
#: The Redis of mcp-celery's records and the tests' markers; Celery's results too unless
#: TEST_CELERY_BACKEND names another result backend (e.g. PostgreSQL).
BACKEND = os.environ.get("TEST_RESULT_BACKEND", "redis://127.0.0.1:6379/13")
CELERY_BACKEND = os.environ.get("TEST_CELERY_BACKEND") or BACKEND

#: The Sentinel master's name when the broker and results are Celery `sentinel://` URLs (the failover test).
SENTINEL_MASTER = os.environ.get("TEST_SENTINEL_MASTER")

app = Celery("sample_jobs", broker=BROKER, backend=CELERY_BACKEND)
if SENTINEL_MASTER:
    app.conf.broker_transport_options = {"master_name": SENTINEL_MASTER}
    app.conf.result_backend_transport_options = {"master_name": SENTINEL_MASTER}
mcp_celery.configure_app(app)

# Markers let tests see what a job body did, from outside the worker (on the store's cluster in the
# cluster pass of the tests: conftest).
markers: Any = sync_client(
    redis_target(os.environ.get("TEST_MARKERS_URL") or BACKEND, master_name=SENTINEL_MASTER), socket_timeout=None
)
#: mcp-celery's own Redis: the result backend's unless a store pass of the tests puts it elsewhere.
STORE = os.environ.get("MCP_CELERY_REDIS_URL") or BACKEND

CONFIRM = {"type": "object", "properties": {"confirm": {"type": "boolean"}}, "required": ["confirm"]}
NAME = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


class Greeting(BaseModel):
    text: str
    length: int


@mcp_celery.tool(app)
def echo(text: str, times: int = 1) -> str:
    """Repeat the text."""
    return " ".join([text] * times)


@mcp_celery.tool(app)
def greeting(name: str) -> Greeting:
    """A structured result."""
    text = f"Hello, {name}!"
    return Greeting(text=text, length=len(text))


@mcp_celery.tool(app, task_mode="forbidden")
def sync_only(text: str) -> str:
    return text.upper()


@mcp_celery.tool(app, task_mode="forbidden")
def forbidden_loop(ctx: mcp_celery.JobContext, seconds: float, marker: str) -> str:
    """Never a task: notes its task id in `marker`, then a checkpoint every 50 ms for `seconds`."""
    return _noting_loop(ctx, seconds, marker)


def _noting_loop(ctx: mcp_celery.JobContext, seconds: float, marker: str) -> str:
    markers.set(marker, ctx.task_id, ex=600)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        ctx.check_cancelled()
        time.sleep(0.05)
    return "finished"


# ---------------------------------------------------------------- clients without the tasks extension


@mcp_celery.tool(app)
def slow_greeting(ctx: mcp_celery.JobContext, name: str, seconds: float) -> Greeting:
    """A structured result after `seconds` (past a plain call's inline window)."""
    ctx.status(f"greeting {name} in {seconds:g} s")
    ctx.sleep(seconds)
    text = f"Hello, {name}!"
    return Greeting(text=text, length=len(text))


@mcp_celery.tool(app)
def ask_early_and_late(ctx: mcp_celery.JobContext, late_after_s: float = 6) -> str:
    """Asks for a name at once, then, `late_after_s` later (past a plain call's window), for another."""
    first = ctx.elicit("First name?", NAME)
    ctx.status(f"got the first name; asking again in {late_after_s:g} s")
    ctx.sleep(late_after_s)
    second = ctx.elicit("Second name?", NAME)
    return f"{(first.content or {}).get('name')} and {(second.content or {}).get('name')}"


@mcp_celery.tool(app)
def confirm_echo(ctx: mcp_celery.JobContext, text: str, timeout: float = 60) -> str:
    """Asks whether to echo `text` (an optional tool that asks: fine for any client)."""
    answer = ctx.elicit(f"Echo {text!r}?", CONFIRM, timeout=timeout)
    if answer.action != "accept":
        return f"{text}: {answer.action}"
    return f"{text}: {'yes' if (answer.content or {}).get('confirm') else 'no'}"


@mcp_celery.tool(app)
def noting_loop(ctx: mcp_celery.JobContext, seconds: float, marker: str) -> str:
    """Notes its task id in `marker`, then a checkpoint every 50 ms for `seconds`."""
    return _noting_loop(ctx, seconds, marker)


@mcp_celery.tool(app, inline_s=1)
def short_window(ctx: mcp_celery.JobContext, seconds: float) -> str:
    """Its own inline window (1 s) is shorter than the setting's."""
    ctx.sleep(seconds)
    return "done"


@mcp_celery.tool(app, task_mode="required")
def required_job(text: str) -> str:
    return text[::-1]


@mcp_celery.tool(app)
def boom(message: str = "kaboom") -> str:
    raise ValueError(message)


@mcp_celery.tool(app)
def protocol_fail() -> str:
    raise mcp_celery.ProtocolError(-32602, "bad thing", {"why": "testing"})


@mcp_celery.tool(app)
def die() -> str:
    """Kill the pool process running this job, as the OOM killer would."""
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


@mcp_celery.tool(app, time_limit=1)
def too_slow() -> str:
    time.sleep(10)
    return "unreachable"


@mcp_celery.tool(app, soft_time_limit=1, time_limit=20)
def cleans_up(marker: str) -> str:
    """Told to stop by the soft time limit, it cleans up and lets the exception end the job."""
    try:
        time.sleep(10)
    except SoftTimeLimitExceeded:
        markers.set(marker, "cleaned up", ex=600)
        raise
    return "unreachable"


@mcp_celery.tool(app)
def checkpoint_loop(ctx: mcp_celery.JobContext, seconds: float, marker: str = "") -> str:
    """Busy work with a checkpoint (ctx.status) every 50 ms; no cancellable sleep."""
    if marker:
        markers.set(marker, "started", ex=600)
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline:
        i += 1
        ctx.status(f"step {i}")
        time.sleep(0.05)
    return f"finished {i} steps"


@mcp_celery.tool(app)
def detached_probe(ctx: mcp_celery.JobContext, x: int) -> dict[str, object]:
    """Called the plain Celery way (`.delay()`, no MCP task): what its detached context does, and who ran it."""
    ctx.status("halfway")  # progress the Celery way, and a checkpoint that is never cancelled
    try:
        ctx.elicit("?", {"type": "object"})
        asked = "answered"
    except mcp_celery.InputNotSupported:
        asked = "InputNotSupported"
    return {"double": 2 * x, "attached": ctx.attached, "elicit": asked, "parent_pid": os.getppid()}


@mcp_celery.tool(app, queue="later")
def queued_elsewhere(ctx: mcp_celery.JobContext, marker: str) -> str:
    """Routed to a queue the main test worker does not consume."""
    markers.set(marker, "body ran", ex=600)
    return "ran"


@mcp_celery.tool(app)
def stubborn(seconds: float, marker: str) -> str:
    """Never reaches a checkpoint."""
    time.sleep(seconds)
    markers.set(marker, "finished", ex=600)
    return "stubborn done"


@mcp_celery.tool(app, terminate_on_cancel=True)
def stubborn_terminable(seconds: float, marker: str) -> str:
    markers.set(marker, "started", ex=600)
    time.sleep(seconds)
    markers.set(marker, "finished", ex=600)
    return "stubborn done"


@app.task(bind=True)
def legacy_progress(self, steps: int) -> int:  # type: ignore[no-untyped-def]
    """An ordinary Celery task with Celery-style progress."""
    for i in range(steps):
        self.update_state(state="PROGRESS", meta={"current": i + 1, "total": steps})
        time.sleep(0.1)
    return steps


mcp_celery.expose(legacy_progress, name="legacy_progress")


@app.task
def add(a: int, b: int) -> int:
    return a + b


mcp_celery.expose(add)


# ---------------------------------------------------------------- input requests


@mcp_celery.tool(app, task_mode="required")
def ask_one(ctx: mcp_celery.JobContext, timeout: float = 30) -> str:
    return _publish_question(ctx, timeout)


def _publish_question(ctx: mcp_celery.JobContext, timeout: float) -> str:
    answer = ctx.elicit("Publish the model?", CONFIRM, timeout=timeout)
    if answer.action != "accept":
        return f"user chose {answer.action}"
    return "published" if (answer.content or {}).get("confirm") else "kept"


@mcp_celery.tool(app, task_mode="required", park_after_s=None)
def ask_one_holding(ctx: mcp_celery.JobContext, timeout: float = 30) -> str:
    """`ask_one` that never parks: the job waits for the answer in its worker process, whatever the window."""
    return _publish_question(ctx, timeout)


@mcp_celery.tool(app)
def narrate(ctx: mcp_celery.JobContext, lines: int = 3, width: int = 0, every: float = 0, then: int = 0) -> str:
    """Print `lines` lines of live output, `every` seconds apart; with `then`, ask to go on (the task waits
    in input_required, its output readable) and print `then` more."""

    def first() -> int:
        for i in range(lines):
            ctx.output(f"line {i} {'x' * width}".rstrip())
            if every:
                ctx.sleep(every)
        return lines

    ctx.once("first", first)  # a run resumed after parking at the question prints them once
    if then:
        ctx.elicit("Go on?", CONFIRM)
        for i in range(then):
            ctx.output(f"more {i}")
    return f"{lines + then} lines"


#: The queue of `narrate_through_outage`: only the worker of the test that stops the store's Redis takes it.
OUTAGE_QUEUE = "outage"


@mcp_celery.tool(app, queue=OUTAGE_QUEUE)
def narrate_through_outage(ctx: mcp_celery.JobContext, gate: str) -> str:
    """A line of output; then, once the file `gate`.down says the store's Redis is stopped, three lines
    (lost), noted in `gate`.written; then, once `gate`.up says it is back, a last line."""
    ctx.output("before")
    _await_file(f"{gate}.down")
    for i in range(3):
        ctx.output(f"during {i}")  # Redis unreachable: best effort, the job goes on
    Path(f"{gate}.written").touch()
    _await_file(f"{gate}.up")
    ctx.output("after")
    return "went on"


def _await_file(path: str, timeout: float = 120) -> None:
    """Wait for the test to create `path` (the job cannot wait on Redis: it is stopped meanwhile)."""
    deadline = time.monotonic() + timeout
    while not Path(path).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.05)


@mcp_celery.tool(app, task_mode="required")
def ask_two(ctx: mcp_celery.JobContext) -> str:
    answers = ctx.ask(
        {"first": mcp_celery.elicitation("First name?", NAME), "second": mcp_celery.elicitation("Second name?", NAME)}
    )
    return f"{answers['first']['content']['name']} and {answers['second']['content']['name']}"


@mcp_celery.tool(app)
def ask_or_explain(ctx: mcp_celery.JobContext) -> str:
    try:
        ctx.elicit("Continue?", CONFIRM)
    except mcp_celery.InputNotSupported as exc:
        return f"cannot ask: {exc}"
    return "asked"


@mcp_celery.tool(app, task_mode="required")
def ask_sample_and_roots(ctx: mcp_celery.JobContext) -> str:
    sample = ctx.sample("Say hi", max_tokens=10)
    roots = ctx.roots()
    text = sample.content.text if sample.content.type == "text" else "?"  # type: ignore[union-attr]
    return f"{text} / {[str(r.uri) for r in roots.roots]}"


@mcp_celery.tool(app, task_mode="required", acks_late=True, reject_on_worker_lost=True)
def two_rounds(ctx: mcp_celery.JobContext, marker: str) -> str:
    """Two questions in a row; counts its executions, to show answers replay after a redelivery.

    At-least-once (late ack, reject on worker loss): only such a job runs again on a second delivery.
    """
    runs = markers.incr(marker)
    first = ctx.elicit("First?", NAME)
    second = ctx.elicit("Second?", NAME)
    return f"{(first.content or {})['name']},{(second.content or {})['name']},runs={runs}"


@mcp_celery.tool(
    app,
    task_mode="required",
    ask_first=lambda args: (
        {"confirm": mcp_celery.elicitation(f"Delete {args['count']} files from {args['bucket']}?", CONFIRM)}
        if args["count"] > 0
        else None
    ),
)
def delete_files(ctx: mcp_celery.JobContext, bucket: str, count: int) -> str:
    answer = ctx.first_answers.get("confirm")
    if answer is None:
        return "nothing to delete"
    if answer["action"] == "accept" and answer["content"]["confirm"]:
        return f"deleted {count} files from {bucket}"
    return "kept everything"


@mcp_celery.tool(app, task_mode="required")
def ask_then_work(ctx: mcp_celery.JobContext, seconds: float = 30) -> str:
    """Asks first, then works with a checkpoint every 50 ms (shows what follows an answer)."""
    ctx.elicit("Go ahead?", CONFIRM)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        ctx.check_cancelled()
        time.sleep(0.05)
    return "worked"


# ---------------------------------------------------------------- lost workers


@mcp_celery.tool(app, queue="doomed")
def doomed_loop(ctx: mcp_celery.JobContext, seconds: float, marker: str) -> str:
    """Counts its runs in `marker`, then works with a checkpoint every 50 ms (its worker gets killed)."""
    markers.incr(marker)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        ctx.status("working")
        time.sleep(0.05)
    return "survived"


@mcp_celery.tool(app, time_limit=10 * 86400)
def patient(ctx: mcp_celery.JobContext, marker: str, seconds: float = 30) -> str:
    """A tool whose own hard time limit (10 days) is far beyond the app's."""
    markers.set(marker, "started", ex=600)
    ctx.sleep(seconds)
    return "done"


@mcp_celery.tool(app)
def nap(seconds: float, flag_file: str) -> str:
    """Sleeps without touching Redis, then creates `flag_file` just before it returns."""
    time.sleep(seconds)
    with open(flag_file, "w") as flag:
        flag.write("returning")
    return "rested"


@mcp_celery.tool(app)
def steady(seconds: float, flag_file: str, ctx: mcp_celery.JobContext) -> str:
    """Reports progress and checks for cancel every 20 ms for `seconds`, touching Redis only through ctx."""
    end = time.monotonic() + seconds
    step = 0
    while time.monotonic() < end:
        step += 1
        ctx.status(f"step {step}")
        time.sleep(0.02)
    with open(flag_file, "w") as flag:
        flag.write("returning")
    return f"steady after {step} steps"


@mcp_celery.tool(app)
def held_start(hold_file: str) -> str:
    """Returns at once; its pool process first waits (see `_hold_before_started`) until `hold_file` exists.

    Notes each run of its body in `<hold_file>.ran`."""
    with open(f"{hold_file}.ran", "a") as ran:
        ran.write("ran\n")
    return "started after the hold"


class OwnRequest(Request):
    """A tool's own Celery request class, doing something of its own when a worker accepts the job."""

    def on_accepted(self, pid: str, time_accepted: float) -> None:
        hold = (self.kwargs or {}).get("hold_file")
        if isinstance(hold, str):
            with open(f"{hold}.accepted", "w") as accepted:
                accepted.write("own request")
        super().on_accepted(pid, time_accepted)


@app.task(Request=OwnRequest)
def own_request_held_start(hold_file: str) -> str:
    """`held_start` as an ordinary Celery task with its own Request class (exposed below)."""
    return "started after the hold"


mcp_celery.expose(own_request_held_start)


@mcp_celery.tool(app, queue="doomed")
def doomed_held_start(hold_file: str) -> str:
    """`held_start` on the `doomed` queue, whose worker a test kills while it holds; notes each run."""
    with open(f"{hold_file}.ran", "a") as ran:
        ran.write("ran\n")
    return "started after the hold"


@signals.task_prerun.connect(weak=False)
def _hold_before_started(task: object = None, kwargs: dict[str, object] | None = None, **_: object) -> None:
    """Holds `held_start` (and `doomed_held_start`) in the instant before Celery stores its STARTED
    state, after the worker's early ack, so that a test can stop Redis or kill the worker right
    then: creates `<hold_file>.reached`, then waits for `hold_file`."""
    hold = (kwargs or {}).get("hold_file")
    if not str(getattr(task, "name", "")).endswith("held_start") or not isinstance(hold, str):
        return
    with open(f"{hold}.reached", "w") as reached:
        reached.write("held")
    deadline = time.monotonic() + 120
    while not os.path.exists(hold) and time.monotonic() < deadline:
        time.sleep(0.02)


def _hold(hold_file: str) -> None:
    """Create `<hold_file>.reached`, then wait (two minutes at most) until `hold_file` exists."""
    with open(f"{hold_file}.reached", "w") as reached:
        reached.write("held")
    deadline = time.monotonic() + 120
    while not os.path.exists(hold_file) and time.monotonic() < deadline:
        time.sleep(0.02)


@mcp_celery.tool(app)
def held_once(ctx: mcp_celery.JobContext, hold_file: str, inside: bool) -> str:
    """`ctx.once` with a hold (`_hold`) inside its work (`inside`: the value is stored after the hold)
    or just before the call (the stored value is looked for after it); each call of the work is noted
    in `<hold_file>.calls`."""

    def work() -> str:
        with open(f"{hold_file}.calls", "a") as calls:
            calls.write("called\n")
        if inside:
            _hold(hold_file)
        return "built"

    if not inside:
        _hold(hold_file)
    return f"{ctx.once('build', work)} once"


# ---------------------------------------------------------------- a backlog behind busy slots


@mcp_celery.tool(app, queue="backlog")
def backlog_blocker(ctx: mcp_celery.JobContext, release: str, marker: str) -> str:
    """Holds one slot of the `backlog` queue's worker until `release` is set (at most two minutes)."""
    markers.set(marker, "started", ex=600)
    deadline = time.monotonic() + 120
    while not markers.exists(release) and time.monotonic() < deadline:
        ctx.sleep(0.05)
    return "released"


@mcp_celery.tool(app, queue="backlog")
def backlog_job(runs: str, index: int) -> str:
    """Notes that it ran (index in the `runs` hash) and returns at once."""
    markers.hincrby(runs, str(index), 1)
    return f"job {index} ran"


@mcp_celery.tool(app, queue="backlog", terminate_on_cancel=True)
def backlog_terminable(runs: str, index: int) -> str:
    """`backlog_job` for a tool that asks to be terminated when it ignores a cancel."""
    markers.hincrby(runs, str(index), 1)
    return f"job {index} ran"


# ---------------------------------------------------------------- at-least-once (retry_on_worker_loss)


@mcp_celery.tool(app, queue="doomed", retry_on_worker_loss=True)
def doomed_retry_loop(ctx: mcp_celery.JobContext, seconds: float, marker: str) -> str:
    """At-least-once: counts its runs, then works with a checkpoint every 50 ms (its worker gets killed)."""
    runs = markers.incr(marker)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        ctx.status("working")
        time.sleep(0.05)
    return f"survived runs={runs}"


@mcp_celery.tool(app, retry_on_worker_loss=True)
def die_once(marker: str) -> str:
    """At-least-once: its first run kills its own pool process, as the OOM killer would; the re-run returns."""
    runs = markers.incr(marker)
    if runs == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return f"runs={runs}"


@mcp_celery.tool(app, queue="doomed", task_mode="required", retry_on_worker_loss=True)
def doomed_two_rounds(ctx: mcp_celery.JobContext, marker: str) -> str:
    """At-least-once, two questions in a row; counts its runs (its worker gets killed between them)."""
    runs = markers.incr(marker)
    first = ctx.elicit("First?", NAME)
    second = ctx.elicit("Second?", NAME)
    return f"{(first.content or {})['name']},{(second.content or {})['name']},runs={runs}"


@mcp_celery.tool(app, retry_on_worker_loss=2)
def always_dies(marker: str) -> str:
    """At-least-once, but every run kills its own pool process: it must end, not run for ever."""
    markers.incr(marker)
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


# ---------------------------------------------------------------- workflows (a Celery canvas as one MCP task)


class SweepSum(TypedDict):
    sum: int
    failed: list[str]


@app.task
def wf_member(x: int, seconds: float = 0, marker: str = "", fail: bool = False) -> int:
    """An ordinary Celery task as a workflow member: notes its run, works with checkpoints, squares x."""
    if marker:
        markers.hset(marker, str(x), os.getpid())
    ctx = mcp_celery.current_context()
    deadline = time.monotonic() + seconds
    step = 0
    while time.monotonic() < deadline:
        step += 1
        if ctx is not None:
            ctx.status(f"member {x}: step {step}")  # a checkpoint too
        time.sleep(0.05)
    if fail:
        raise ValueError(f"member {x} failed on purpose")
    return x * x


@app.task(acks_late=True, reject_on_worker_lost=True, time_limit=600)
def wf_member_again(x: int, seconds: float = 0, marker: str = "") -> int:
    """`wf_member`, at-least-once: runs again when its worker is lost; counts its runs in `marker`."""
    if marker:
        markers.hincrby(marker, str(x), 1)
    ctx = mcp_celery.current_context()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ctx is not None:
            ctx.status(f"member {x} working")
        time.sleep(0.05)
    return x * x


@app.task
def wf_merge(results: list[int]) -> SweepSum:
    """The merge step: the sum of the members that succeeded, and which failed."""
    ctx = mcp_celery.current_context()
    failed = [] if ctx is None else [f["member"] for f in ctx.failed_members]
    return {"sum": sum(results), "failed": failed}


@app.task
def wf_asking_merge(results: list[int]) -> SweepSum:
    """A merge step that asks before it answers."""
    ctx = mcp_celery.current_context()
    assert ctx is not None
    answer = ctx.elicit(f"Keep the sum {sum(results)}?", CONFIRM)
    kept = answer.action == "accept" and bool((answer.content or {}).get("confirm"))
    return {"sum": sum(results) if kept else 0, "failed": []}


@mcp_celery.tool(app)
def sweep(
    ctx: mcp_celery.JobContext,
    n: int,
    seconds: float = 0,
    fail_at: int = -1,
    policy: str = "fail",
    marker: str = "",
    asking: bool = False,
    queue: str = "celery",
    at_least_once: bool = False,
    merge_queue: str = "celery",
) -> SweepSum:
    """n members in parallel (member i squares i) on `queue`, then a merge step that sums them."""
    if at_least_once:
        runs = [wf_member_again.s(i, seconds, marker) for i in range(n)]  # type: ignore[attr-defined]
    else:
        # The failing member fails at once: the others are still running when it does.
        runs = [wf_member.s(i, 0 if i == fail_at else seconds, marker, i == fail_at) for i in range(n)]  # type: ignore[attr-defined]
    members = group(run.set(queue=queue) for run in runs)
    merge = (wf_asking_merge if asking else wf_merge).s().set(queue=merge_queue)  # type: ignore[attr-defined]
    ctx.run_workflow(members, merge=merge, on_failure="partial" if policy == "partial" else "fail")


@mcp_celery.tool(app)
def steps(ctx: mcp_celery.JobContext, n: int, seconds: float = 0, last_queue: str = "celery") -> str:
    """A chain of n steps (each squares its own index), the last step's result as the task's."""
    runs = [wf_member.si(i, seconds) for i in range(n)]  # type: ignore[attr-defined]
    ctx.run_workflow(chain(*runs[:-1], runs[-1].set(queue=last_queue)))


@mcp_celery.tool(app)
def fanout(ctx: mcp_celery.JobContext, n: int, own_ids: bool = False) -> str:
    """A group without a merge step: the task's result is every member's (`own_ids`: members with ids of their own)."""
    runs = [wf_member.s(i) for i in range(n)]  # type: ignore[attr-defined]
    ctx.run_workflow([run.set(task_id=f"mine-{i}") for i, run in enumerate(runs)] if own_ids else runs)


# ---------------------------------------------------------------- repeated calls (idempotency keys, dedupe windows)


def _count_run(ctx: mcp_celery.JobContext, counter: str, hold: str) -> int:
    """Counts this run in `counter` (the side effect a repeated call must not repeat), then, with `hold`,
    works with checkpoints until the test sets that marker (bounded: a forgotten hold ends in 60 s)."""
    runs = int(markers.incr(counter))
    markers.expire(counter, 600)
    deadline = time.monotonic() + 60
    while hold and not markers.exists(hold) and time.monotonic() < deadline:
        ctx.check_cancelled()
        time.sleep(0.02)
    return runs


@mcp_celery.tool(app)
def count_run(ctx: mcp_celery.JobContext, counter: str, hold: str = "") -> int:
    """Counts its run in `counter`; with `hold`, runs until that marker is set."""
    return _count_run(ctx, counter, hold)


@mcp_celery.tool(app, dedupe_s=30)
def count_run_deduped(ctx: mcp_celery.JobContext, counter: str, hold: str = "") -> int:
    """`count_run` with a 30 s dedupe window: a repeat of a running call gets its task."""
    return _count_run(ctx, counter, hold)


@mcp_celery.tool(app, task_mode="forbidden")
def count_run_sync(ctx: mcp_celery.JobContext, counter: str, hold: str = "") -> int:
    """`count_run`, never a task (a synchronous call)."""
    return _count_run(ctx, counter, hold)
