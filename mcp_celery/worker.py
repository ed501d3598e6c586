"""The Celery side: turning functions and existing tasks into MCP tools, and running them.

Worker tier: imports celery and redis, never mcp.server. Every MCP tool's Celery task runs
through `_execute`, which (only for jobs started through MCP, i.e. with a task record)
refuses to start a cancelled task, publishes the JobContext, turns a cancellation into
Celery's REVOKED state, and shortens the record's life to the TTL once the job is over.
Jobs started the ordinary Celery way run exactly as before.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar, overload

import pydantic_core
from celery import Celery, Task
from celery.exceptions import Ignore

from mcp_celery.context import JobContext, _current
from mcp_celery.errors import TaskCancelled, ToolDefinitionError
from mcp_celery.protocol import TaskMode
from mcp_celery.runtime import runtime
from mcp_celery.tools import AskFirst, ToolSpec, build_input_model, registry

__all__ = ["configure_app", "expose", "tool"]

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

#: Longest job the recommended configuration expects; also its hard time limit.
DEFAULT_MAX_JOB = timedelta(hours=6)


def configure_app(app: Celery, *, max_job: timedelta = DEFAULT_MAX_JOB) -> None:
    """Apply the Celery settings long MCP jobs need (at-most-once delivery, visible states).

    Acks early and no prefetch, so the Redis visibility timeout can never run a long job
    twice; STARTED and custom states are tracked and sent as events for Flower; messages and
    results are JSON only (a pickle message is rejected, never executed). Call it
    before your own `app.conf` changes if you want to override any of these.
    """
    seconds = int(max_job.total_seconds())
    app.conf.update(
        task_acks_late=False,
        worker_prefetch_multiplier=1,
        worker_disable_prefetch=True,
        task_track_started=True,
        result_extended=True,
        worker_send_task_events=True,
        task_send_sent_event=True,
        task_time_limit=seconds,
        broker_transport_options={**app.conf.broker_transport_options, "visibility_timeout": 2 * seconds},
        broker_connection_retry_on_startup=True,
        # JSON only, both ways: a pickle message published to the broker is refused, never
        # unpickled (unpickling runs code), and results are never read back as pickle.
        accept_content=["json"],
        result_accept_content=["json"],
        task_serializer="json",
        result_serializer="json",
    )


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
    task: TaskMode = "optional",
    terminate_on_cancel: bool = False,
    ask_first: AskFirst | None = None,
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
    task: TaskMode = "optional",
    terminate_on_cancel: bool = False,
    ask_first: AskFirst | None = None,
    **task_options: Any,
) -> Any:
    """Make `fn` a Celery task of `app` and an MCP tool.

    Args:
        app: the Celery app whose workers run the job.
        name: MCP tool name (default: the function name).
        title: human-readable title.
        description: tool description (default: the docstring).
        task: "optional" (a task when the client declares the tasks extension, else run
            synchronously), "required" (-32021 for clients without it) or "forbidden"
            (always synchronous).
        terminate_on_cancel: when a cancelled job reaches no checkpoint within the grace
            period, kill its worker process (`revoke(terminate=True)`).
        ask_first: questions settled with the client before any job is queued (an MRTR
            round on `tools/call`): `{key: request}` or a function of the arguments
            returning one; the job reads the answers from `ctx.first_answers`.
        **task_options: passed to `app.task` (e.g. `queue`, `time_limit`); `celery_name=` sets the
            Celery task name (default: `module.function`, as Celery names it).

    A parameter annotated `JobContext` receives the job's context and is not an argument.

    Raises:
        ToolDefinitionError: the signature cannot become an MCP input schema.
    """

    def decorate(func: F) -> F:
        tool_name = name or func.__name__
        if "bind" in task_options:
            raise ToolDefinitionError(f"tool {tool_name!r}: bind is not supported; declare a JobContext parameter")
        model, context_param, output = build_input_model(func, tool_name, skip=(), context_type=JobContext)

        def body(**arguments: Any) -> Any:
            ctx = _current.get()
            values = model.model_validate(arguments)
            kwargs = {field: getattr(values, field) for field in type(values).model_fields}
            if context_param is not None:
                kwargs[context_param] = ctx
            value = func(**kwargs)
            return output.dump_python(value, mode="json") if output else pydantic_core.to_jsonable_python(value)

        body.__name__, body.__qualname__, body.__module__ = func.__name__, func.__qualname__, func.__module__
        body.__doc__ = func.__doc__
        make_task = app.task(name=task_options.pop("celery_name", None), typing=False, **task_options)
        celery_task = make_task(body)  # type: ignore[no-untyped-call]
        spec = ToolSpec(
            name=tool_name,
            celery_task=celery_task,
            input_model=model,
            description=description or inspect.getdoc(func),
            title=title,
            mode=task,
            context_param=context_param,
            output_adapter=output,
            terminate_on_cancel=terminate_on_cancel,
            ask_first=ask_first,
        )
        _register(app, spec)
        return celery_task  # type: ignore[return-value,no-any-return]

    return decorate(fn) if fn is not None else decorate


def expose(
    celery_task: Task[Any, Any],
    *,
    name: str | None = None,
    title: str | None = None,
    description: str | None = None,
    task: TaskMode = "optional",
    terminate_on_cancel: bool = False,
) -> Task[Any, Any]:
    """Expose an existing Celery task as an MCP tool, its code unchanged.

    Its parameters become the input schema (a bound task's `self` is skipped); progress it
    reports with `self.update_state(state=..., meta={...})` shows as `statusMessage`.
    Inside it, `mcp_celery.current_context()` returns the JobContext when called through MCP.

    Raises:
        ToolDefinitionError: the signature cannot become an MCP input schema.
    """
    tool_name = name or celery_task.name.rsplit(".", 1)[-1]
    run = celery_task.run
    skip = ("self",) if getattr(celery_task, "bind", False) or _is_bound(run) else ()
    model, _, output = build_input_model(_unbound(run), tool_name, skip=skip, context_type=None)
    spec = ToolSpec(
        name=tool_name,
        celery_task=celery_task,
        input_model=model,
        description=description or inspect.getdoc(run),
        title=title,
        mode=task,
        output_adapter=output,
        terminate_on_cancel=terminate_on_cancel,
    )
    _register(celery_task.app, spec)
    return celery_task


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


def _wrap_run(celery_task: Task[Any, Any]) -> None:
    """Route the task's body through `_execute`; Celery's tracer calls `task.run`."""
    run = celery_task.run
    if getattr(run, "_mcp_celery_wrapped", False):
        return

    @functools.wraps(run)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return _execute(celery_task, run, args, kwargs)

    wrapped._mcp_celery_wrapped = True  # type: ignore[attr-defined]
    celery_task.run = wrapped  # type: ignore[method-assign]


def _execute(
    celery_task: Task[Any, Any], run: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    rt = runtime(celery_task.app)
    task_id: str | None = celery_task.request.id
    # No record: an ordinary Celery call (or an eager run), not an MCP task; it runs as before.
    fields = rt.sync_store.job_fields(task_id, rt.keep_s) if task_id and not celery_task.request.is_eager else None
    ctx = JobContext(celery_task, rt, fields)
    token = _current.set(ctx)
    try:
        if fields is not None and fields.get("cancel"):
            _mark_cancelled(celery_task, "cancelled before start")
        return run(*args, **kwargs)
    except TaskCancelled:
        if fields is None:
            raise
        _mark_cancelled(celery_task, "cancelled by client")
    finally:
        _current.reset(token)
        if fields is not None and task_id:
            rt.sync_store.job_ended(task_id, rt.ttl_s, asked=ctx.asked)


def _mark_cancelled(celery_task: Task[Any, Any], reason: str) -> None:
    """End the job as REVOKED; Ignore stops Celery from storing anything over it."""
    celery_task.backend.mark_as_revoked(str(celery_task.request.id), reason=reason, request=celery_task.request)
    try:
        # Celery sends no event for Ignore; without this Flower shows the task STARTED for ever.
        celery_task.send_event("task-revoked", terminated=False, expired=False, reason=reason)
    except Exception:  # noqa: BLE001
        logger.warning("could not send the task-revoked event for %s", celery_task.request.id, exc_info=True)
    raise Ignore(reason)


def _is_bound(run: Callable[..., Any]) -> bool:
    return inspect.ismethod(run)


def _unbound(run: Callable[..., Any]) -> Callable[..., Any]:
    return getattr(run, "__func__", run)
