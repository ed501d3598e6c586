"""`tool` and `expose`: turning functions and existing Celery tasks into MCP tools.

Worker tier: imports celery, never `mcp`. Each decorator builds a `ToolSpec` (validated at
import time), registers it on the app, and routes the Celery task's body through
`mcp_celery.worker.execution.run_job`.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable
from typing import Any, Literal, TypeVar, overload

import pydantic
import pydantic_core
from celery import Celery, Task

from mcp_celery.core.canvas import PARENT_HEADER
from mcp_celery.core.task_options import tool_defined
from mcp_celery.core.tools import AskFirst, ToolSpec, build_input_model, registry
from mcp_celery.core.workflows import WorkflowSummary
from mcp_celery.errors import ToolDefinitionError
from mcp_celery.protocol import TaskMode
from mcp_celery.worker.context import JobContext, current_context
from mcp_celery.worker.execution import MAX_RERUNS_ATTRIBUTE, WRAPPED, is_tool_task, run_job
from mcp_celery.worker.parking import PARK_AFTER_ATTRIBUTE, check_park_after

__all__ = ["expose", "tool"]

F = TypeVar("F", bound=Callable[..., Any])
#: A tool's park window: seconds, None (never parks) or "setting" (the park_after_s setting).
ParkAfter = float | None | Literal["setting"]

#: How many times `retry_on_worker_loss=True` lets a job run again after losing its worker.
DEFAULT_RERUNS = 3


@overload
def tool(app: Celery, fn: F, /) -> F: ...
@overload
def tool(
    app: Celery,
    fn: None = None,
    /,
    *,
    name: str | None = None,
    title: str | None = None,
    description: str | None = None,
    task_mode: TaskMode = "optional",
    terminate_on_cancel: bool = False,
    ask_first: AskFirst | None = None,
    retry_on_worker_loss: bool | int = False,
    inline_s: float | None = None,
    dedupe_s: float | None = None,
    park_after_s: ParkAfter = "setting",
    workflow_summary: WorkflowSummary | None = None,
    **task_options: Any,
) -> Callable[[F], F]: ...
def tool(
    app: Celery,
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    title: str | None = None,
    description: str | None = None,
    task_mode: TaskMode = "optional",
    terminate_on_cancel: bool = False,
    ask_first: AskFirst | None = None,
    retry_on_worker_loss: bool | int = False,
    inline_s: float | None = None,
    dedupe_s: float | None = None,
    park_after_s: ParkAfter = "setting",
    workflow_summary: WorkflowSummary | None = None,
    **task_options: Any,
) -> Any:
    """Make `fn` a Celery task of `app` and an MCP tool.

    Args:
        app: the Celery app whose workers run the job.
        name: MCP tool name (default: the function name).
        title: human-readable title.
        description: tool description (default: the docstring).
        task_mode: "optional" (a task when the client declares the tasks extension, else
            run synchronously), "required" (-32021 for clients without it) or "forbidden"
            (always synchronous).
        terminate_on_cancel: when a cancelled job reaches no checkpoint within the grace
            period, kill its worker process (`revoke(terminate=True)`).
        ask_first: questions settled with the client before any job is queued (an MRTR
            round on `tools/call`): `{key: request}` or a function of the arguments
            returning one; the job reads the answers from `ctx.first_answers`.
        retry_on_worker_loss: at-least-once delivery, for idempotent jobs only: when the
            worker running the job is lost (its process or the whole worker killed), the job
            runs again from the start on another worker instead of ending failed; answers
            already given are replayed. True allows 3 runs again (a job that kills its worker
            every time then ends failed), a number that many. Sets Celery's `acks_late` and
            `reject_on_worker_lost` (not Celery's own `retry_on_worker_lost`, which retries
            after a countdown).
        inline_s: how long a call from a client without the tasks extension waits for the job
            before it answers with a task handle (the job runs on); default the inline_s setting
            (MCP_CELERY_INLINE_S, 20 s).
        dedupe_s: for hosts that retry a call without an idempotency key: a call of the same principal
            with the same arguments as one whose task has not ended and was created less than this many
            seconds ago gets that task instead of running the job again (0: never; default the dedupe_s
            setting, MCP_CELERY_DEDUPE_S, 0). A call with a key is decided by its key alone.
        park_after_s: how long a question waits for its answer in the worker process before the
            job parks (its run ends and frees the process; the answer runs it again from the top
            on any worker, see `JobContext.once`): "setting" (the default) for the park_after_s
            setting (MCP_CELERY_PARK_AFTER_S, 30 s), 0 to park at once, None never to park (for a
            job that holds something it cannot give back).
        workflow_summary: for a job that hands its task over to a workflow (`ctx.run_workflow`):
            the task's statusMessage while it runs, from its members (`MemberStatus` each; None or
            "" for the default `3/8 done, 2 running`).
        **task_options: passed to `app.task` (e.g. `queue`, `time_limit`); `celery_name=` sets the
            Celery task name (default: `module.function`, as Celery names it). A name that is not
            Celery's but close to one of the keywords above (`inlines_s=`) is refused as a typo. `track_started`
            defaults to False: the task record shows the job running, and Celery's own STARTED
            write would cost every job a round trip.

    A parameter annotated `JobContext` receives the job's context and is not an argument. Options not
    given here follow the app's configuration whenever it is settled (`configure_app`, worker start,
    server start), so `configure_app` may come before or after the decorators; unless
    `soft_time_limit=` is given, a tool gets a soft limit a minute before its hard one (at 90% of a
    short one).

    Raises:
        ToolDefinitionError: the signature cannot become an MCP input schema, a keyword is a
            misspelling of one of ours, or (on an app `configure_app` has configured) an
            at-least-once tool's hard time limit is not below a Redis broker's visibility timeout.
    """
    refuse_misspelled("tool", task_options, _TOOL_KEYWORDS)

    def decorate(func: F) -> F:
        tool_name = name or func.__name__
        options = dict(task_options)
        # Celery's own STARTED write is a round trip per job that a tool does not need: the task record
        # shows the job running (JOB_START), and Flower learns it from the task-started event. Given,
        # so that the app's task_track_started (configure_app sets it) does not override it.
        options.setdefault("track_started", False)
        if retry_on_worker_loss:
            _deliver_at_least_once(tool_name, options, retry_on_worker_loss)
        given = frozenset(option for option, value in options.items() if value is not None)
        celery_task, model, context_param, output = _job_task(app, func, tool_name, options)
        _set_park_after(celery_task, tool_name, park_after_s)
        spec = ToolSpec(
            name=tool_name,
            celery_task=celery_task,
            input_model=model,
            description=description or inspect.getdoc(func),
            title=title,
            task_mode=task_mode,
            context_param=context_param,
            output_adapter=output,
            terminate_on_cancel=terminate_on_cancel,
            ask_first=ask_first,
            inline_s=inline_s,
            dedupe_s=dedupe_s,
            workflow_summary=workflow_summary,
            given=given,
        )
        _register(app, spec)
        return celery_task  # type: ignore[return-value,no-any-return]

    return decorate(fn) if fn is not None else decorate


def _job_task(
    app: Celery, func: Callable[..., Any], tool_name: str, task_options: dict[str, Any]
) -> tuple[Task[Any, Any], type[pydantic.BaseModel], str | None, pydantic.TypeAdapter[Any] | None]:
    """The Celery task that runs `func` as a job: arguments validated, context injected, result JSON-ready."""
    if "bind" in task_options:
        raise ToolDefinitionError(f"tool {tool_name!r}: bind is not supported; declare a JobContext parameter")
    if "task" in task_options:
        raise ToolDefinitionError(f"tool {tool_name!r}: the task mode is set with task_mode=, not task=")
    model, context_param, output = build_input_model(func, tool_name, skip=(), context_type=JobContext)

    def body(**arguments: Any) -> Any:
        values = model.model_validate(arguments)
        kwargs = {field: getattr(values, field) for field in type(values).model_fields}
        if context_param is not None:
            kwargs[context_param] = current_context()
        value = func(**kwargs)
        return output.dump_python(value, mode="json") if output else pydantic_core.to_jsonable_python(value)

    body.__name__, body.__qualname__, body.__module__ = func.__name__, func.__qualname__, func.__module__
    body.__doc__ = func.__doc__
    # The time limits (a soft one a minute before the hard one) are settled from the app's configuration
    # once the tool is registered, and again whenever it may have changed (mcp_celery.core.task_options).
    # Not shared: Celery would otherwise add the tool to every app finalized later (a name clash
    # when two apps define the same tool, as the demo jobs do on `jobs` and on their own app).
    task_options.setdefault("shared", False)
    make_task = app.task(name=task_options.pop("celery_name", None), typing=False, **task_options)
    return make_task(body), model, context_param, output  # type: ignore[no-untyped-call]


def expose(
    celery_task: Task[Any, Any],
    *,
    name: str | None = None,
    title: str | None = None,
    description: str | None = None,
    task_mode: TaskMode = "optional",
    terminate_on_cancel: bool = False,
    retry_on_worker_loss: bool | int = False,
    inline_s: float | None = None,
    dedupe_s: float | None = None,
    park_after_s: ParkAfter = "setting",
    **unknown: Any,
) -> Task[Any, Any]:
    """Expose an existing Celery task as an MCP tool, its code unchanged.

    Its parameters become the input schema (a bound task's `self` is skipped); progress it
    reports with `self.update_state(state=..., meta={...})` shows as `statusMessage`.
    Inside it, `mcp_celery.current_context()` returns the JobContext when called through MCP.
    `retry_on_worker_loss=True` makes its delivery at-least-once, `inline_s` sets its inline
    window, `dedupe_s` its dedupe window and `park_after_s` its park window, as for `tool`. The
    tool's name is the last segment of the Celery task's name (`proj.tasks.add` is `add`) unless
    `name=` is given.

    Raises:
        ToolDefinitionError: as for `tool` (a keyword close to one of `expose`'s is named as a typo).
        TypeError: any other keyword `expose` does not take.
    """
    refuse_misspelled("expose", unknown, _EXPOSE_KEYWORDS)
    if unknown:
        raise TypeError(f"expose() got an unexpected keyword argument {next(iter(unknown))!r}")
    tool_name = name or celery_task.name.rsplit(".", 1)[-1]
    if retry_on_worker_loss:
        options: dict[str, Any] = {}
        _deliver_at_least_once(tool_name, options, retry_on_worker_loss)
        for option, value in options.items():
            setattr(celery_task, option, value)
    _set_park_after(celery_task, tool_name, park_after_s)
    run = celery_task.run
    skip = ("self",) if getattr(celery_task, "bind", False) or _is_bound(run) else ()
    model, _, output = build_input_model(_unbound(run), tool_name, skip=skip, context_type=None)
    spec = ToolSpec(
        name=tool_name,
        celery_task=celery_task,
        input_model=model,
        description=description or inspect.getdoc(run),
        title=title,
        task_mode=task_mode,
        output_adapter=output,
        terminate_on_cancel=terminate_on_cancel,
        inline_s=inline_s,
        dedupe_s=dedupe_s,
    )
    _register(celery_task.app, spec)
    return celery_task


def refuse_misspelled(decorator: str, given: dict[str, Any], ours: frozenset[str]) -> None:
    """Refuse a keyword that is not Celery's but close to one of `ours`: a typo Celery would keep silently.

    Raises:
        ToolDefinitionError: naming the keyword meant.
    """
    for option in given:
        if option in ours or option in _CELERY_OPTIONS:
            continue
        meant = difflib.get_close_matches(option, sorted(ours), n=1, cutoff=0.8)
        if meant:
            raise ToolDefinitionError(f"{decorator}(): unknown option {option!r}; did you mean {meant[0]!r}?")


def _keywords(function: Callable[..., Any]) -> frozenset[str]:
    parameters = inspect.signature(function).parameters.values()
    return frozenset(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY)


#: The keywords of `tool` and `expose`, against which a misspelt one is told.
_TOOL_KEYWORDS = _keywords(tool) | {"celery_name"}
_EXPOSE_KEYWORDS = _keywords(expose)
#: Celery's own task options, passed through whatever they look like (`retry_on_worker_lost` is Celery's).
_CELERY_OPTIONS = frozenset(name for name in dir(Task) if not name.startswith("_")) | {
    "queue",
    "exchange",
    "routing_key",
    "priority",
    "base",
    "bind",
    "shared",
    "lazy",
    "typing",
    "autoretry_for",
    "dont_autoretry_for",
    "retry_kwargs",
    "retry_backoff",
    "retry_backoff_max",
    "retry_jitter",
    "pydantic",
}


def _set_park_after(celery_task: Task[Any, Any], tool_name: str, park_after_s: ParkAfter) -> None:
    """Give the tool's job its own park window (`mcp_celery.worker.parking`); "setting": the setting's."""
    if park_after_s != "setting":
        setattr(celery_task, PARK_AFTER_ATTRIBUTE, check_park_after(tool_name, park_after_s))


def _deliver_at_least_once(tool_name: str, task_options: dict[str, Any], reruns: bool | int) -> None:
    """Late ack and reject on worker loss: the broker keeps the message until the job ends.

    The hard time limit such a tool needs below a Redis broker's visibility timeout is checked
    with the app's configuration (`mcp_celery.core.task_options.check_delivery`).

    Raises:
        ToolDefinitionError: acks_late or reject_on_worker_lost turned off, or a count below 1.
    """
    for option in ("acks_late", "reject_on_worker_lost"):
        if task_options.get(option) is False:
            raise ToolDefinitionError(f"tool {tool_name!r}: retry_on_worker_loss needs {option}=True")
        task_options[option] = True
    # Counted by run_job: a job that kills its worker every time must end, not run for ever.
    allowed = DEFAULT_RERUNS if reruns is True else int(reruns)
    if allowed < 1:
        raise ToolDefinitionError(f"tool {tool_name!r}: retry_on_worker_loss must be True or a positive count")
    task_options[MAX_RERUNS_ATTRIBUTE] = allowed


def _register(app: Celery, spec: ToolSpec) -> None:
    tools = registry(app)
    existing = tools.get(spec.name)
    if existing is not None and existing.celery_task.name != spec.celery_task.name:
        raise ToolDefinitionError(
            f"tool name {spec.name!r} is taken by Celery task {existing.celery_task.name!r}; "
            "pass name=... to one of them"
        )
    _wrap_run(spec.celery_task)
    tool_defined(spec)  # before it is listed: a tool that cannot be delivered is refused whole
    tools[spec.name] = spec
    _watch_from_the_ack(spec.name, spec.celery_task)


#: Celery's request class, and ours (named, not imported: only a worker resolves it).
_DEFAULT_REQUEST = "celery.worker.request:Request"
_TAKEN_REQUEST = "mcp_celery.worker.taken:TakenRequest"


def _watch_from_the_ack(tool_name: str, celery_task: Task[Any, Any]) -> None:
    """Mark the task `taken` when a worker acks its message early (`mcp_celery.worker.taken`)."""
    if celery_task.Request == _DEFAULT_REQUEST:
        celery_task.Request = _TAKEN_REQUEST
    elif celery_task.Request != _TAKEN_REQUEST:
        # The task has a Request class of its own: the same watch, mixed into it. Imported here only:
        # the worker's request module is worker internals that a server importing the tools never needs.
        from mcp_celery.worker.taken import watched_request

        celery_task.Request = watched_request(celery_task.Request, tool_name)  # type: ignore[assignment]


#: Set on the body of an ordinary Celery task that `follow_members` wraps.
_MEMBER_WRAPPED = "_mcp_celery_member"


def follow_members_at_worker_start(sender: Any = None, **_: Any) -> None:
    """In a worker of an app with MCP tools: any of its tasks may be a workflow member (`run_workflow`)."""
    app = getattr(sender, "app", None)
    if isinstance(app, Celery) and registry(app):
        follow_members(app)


def follow_members(app: Celery) -> None:
    """Route the body of every ordinary task of `app` through `run_job` when its message makes it a
    workflow member (the PARENT_HEADER); any other call of it runs exactly as before, untouched.

    At worker start, once the task modules are imported and before the pool forks or Celery builds
    its tracers, which keep the body they find.
    """
    for name, task in app.tasks.items():
        run = getattr(task, "run", None)
        if run is None or name.startswith("celery.") or is_tool_task(task) or getattr(run, _MEMBER_WRAPPED, False):
            continue
        _follow(task, run)


def _follow(celery_task: Task[Any, Any], run: Callable[..., Any]) -> None:
    @functools.wraps(run)
    def followed(*args: Any, **kwargs: Any) -> Any:
        if getattr(celery_task.request, PARENT_HEADER, None) is None:
            return run(*args, **kwargs)
        return run_job(celery_task, run, args, kwargs)

    setattr(followed, _MEMBER_WRAPPED, True)
    celery_task.run = followed  # type: ignore[method-assign]
    _mirror_update_state(celery_task)


def _wrap_run(celery_task: Task[Any, Any]) -> None:
    """Route the task's body through `run_job` (Celery's tracer calls `task.run`), and its progress to MCP."""
    run = celery_task.run
    if getattr(run, WRAPPED, False):
        return

    @functools.wraps(run)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return run_job(celery_task, run, args, kwargs)

    setattr(wrapped, WRAPPED, True)
    celery_task.run = wrapped  # type: ignore[method-assign]
    _mirror_update_state(celery_task)


def _mirror_update_state(celery_task: Task[Any, Any]) -> None:
    """`self.update_state(...)` in an exposed task also shows in its MCP task (the record is all MCP reads)."""
    update_state = celery_task.update_state

    @functools.wraps(update_state)
    def mirrored(task_id: str | None = None, state: str | None = None, meta: Any = None, **kwargs: Any) -> None:
        update_state(task_id, state, meta, **kwargs)
        ctx = current_context()
        if ctx is not None and state is not None and (task_id is None or task_id == ctx.task_id):
            ctx.report_state(state, meta)

    celery_task.update_state = mirrored  # type: ignore[method-assign]


def _is_bound(run: Callable[..., Any]) -> bool:
    return inspect.ismethod(run)


def _unbound(run: Callable[..., Any]) -> Callable[..., Any]:
    return getattr(run, "__func__", run)
