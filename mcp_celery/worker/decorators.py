"""`tool` and `expose`: turning functions and existing Celery tasks into MCP tools.

Worker tier: imports celery, never `mcp`. Each decorator builds a `ToolSpec` (validated at
import time), registers it on the app, and routes the Celery task's body through
`mcp_celery.worker.execution.run_job`.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any, TypeVar, overload

import pydantic
import pydantic_core
from celery import Celery, Task

from mcp_celery.errors import ToolDefinitionError
from mcp_celery.protocol import TaskMode
from mcp_celery.tools import AskFirst, ToolSpec, build_input_model, registry
from mcp_celery.worker.context import JobContext, current_context
from mcp_celery.worker.execution import MAX_RERUNS_ATTRIBUTE, WRAPPED, run_job

__all__ = ["expose", "tool"]

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

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
        **task_options: passed to `app.task` (e.g. `queue`, `time_limit`); `celery_name=` sets the
            Celery task name (default: `module.function`, as Celery names it).

    A parameter annotated `JobContext` receives the job's context and is not an argument.

    Raises:
        ToolDefinitionError: the signature cannot become an MCP input schema.
    """

    def decorate(func: F) -> F:
        tool_name = name or func.__name__
        options = dict(task_options)
        if retry_on_worker_loss:
            _deliver_at_least_once(app, tool_name, options, retry_on_worker_loss)
        celery_task, model, context_param, output = _job_task(app, func, tool_name, options)
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
        )
        _register(app, spec)
        return celery_task  # type: ignore[return-value,no-any-return]

    return decorate(fn) if fn is not None else decorate


def soft_time_limit(hard_s: float) -> float:
    """When a tool is told to stop: a minute before its hard limit, or at 90% of a short one."""
    return max(hard_s - 60, hard_s * 0.9)


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
    hard_limit = task_options.get("time_limit") or app.conf.task_time_limit
    if hard_limit and "soft_time_limit" not in task_options:
        # Told to stop before it is killed: the job may catch SoftTimeLimitExceeded and clean up.
        task_options["soft_time_limit"] = soft_time_limit(float(hard_limit))
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
) -> Task[Any, Any]:
    """Expose an existing Celery task as an MCP tool, its code unchanged.

    Its parameters become the input schema (a bound task's `self` is skipped); progress it
    reports with `self.update_state(state=..., meta={...})` shows as `statusMessage`.
    Inside it, `mcp_celery.current_context()` returns the JobContext when called through MCP.
    `retry_on_worker_loss=True` makes its delivery at-least-once, as for `tool`.

    Raises:
        ToolDefinitionError: the signature cannot become an MCP input schema.
    """
    tool_name = name or celery_task.name.rsplit(".", 1)[-1]
    if retry_on_worker_loss:
        options: dict[str, Any] = {"time_limit": celery_task.time_limit}
        _deliver_at_least_once(celery_task.app, tool_name, options, retry_on_worker_loss)
        for option, value in options.items():
            setattr(celery_task, option, value)
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
    )
    _register(celery_task.app, spec)
    return celery_task


def _deliver_at_least_once(app: Celery, tool_name: str, task_options: dict[str, Any], reruns: bool | int) -> None:
    """Late ack and reject on worker loss: the broker keeps the message until the job ends.

    With a Redis broker, a message not acked within the visibility timeout is handed to another
    worker, running job or not, so the job's hard time limit must be shorter than that timeout
    (`configure_app` makes it twice the longest job). A lost job is re-queued well before
    then by the server (`mcp_celery.server.reaper`).

    Raises:
        ToolDefinitionError: acks_late or reject_on_worker_lost turned off, or no hard time limit
            below the visibility timeout of a Redis broker.
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
    if not str(app.conf.broker_url or "").startswith(("redis", "rediss", "sentinel")):
        return  # RabbitMQ redelivers when the worker's channel closes; no visibility timeout
    timeout = (app.conf.broker_transport_options or {}).get("visibility_timeout", 3600)
    limit = task_options.get("time_limit") or app.conf.task_time_limit
    if not limit or limit >= timeout:
        raise ToolDefinitionError(
            f"tool {tool_name!r}: retry_on_worker_loss needs a hard time limit (now {limit}) shorter than the "
            f"broker's visibility timeout ({timeout} s), or Redis would hand the running job to a second "
            "worker; configure_app(app, max_job=...) sets both"
        )


def _register(app: Celery, spec: ToolSpec) -> None:
    tools = registry(app)
    existing = tools.get(spec.name)
    if existing is not None and existing.celery_task.name != spec.celery_task.name:
        raise ToolDefinitionError(
            f"tool name {spec.name!r} is taken by Celery task {existing.celery_task.name!r}; "
            "pass name=... to one of them"
        )
    tools[spec.name] = spec
    _wrap_run(spec.celery_task)
    _watch_from_the_ack(spec.name, spec.celery_task)


#: Celery's request class, and ours (named, not imported: only a worker resolves it).
_DEFAULT_REQUEST = "celery.worker.request:Request"
_TAKEN_REQUEST = "mcp_celery.worker.taken:TakenRequest"


def _watch_from_the_ack(tool_name: str, celery_task: Task[Any, Any]) -> None:
    """Mark the task `taken` when a worker acks its message early (`mcp_celery.worker.taken`)."""
    if celery_task.Request == _DEFAULT_REQUEST:
        celery_task.Request = _TAKEN_REQUEST
    elif celery_task.Request != _TAKEN_REQUEST:
        logger.warning(
            "tool %r: its task has its own Request class; a worker lost between acking its message and "
            "starting the job leaves the task working",
            tool_name,
        )


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
