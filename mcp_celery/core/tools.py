"""ToolSpec: what the MCP side needs to know about one Celery task exposed as a tool.

The input schema comes from the function signature through pydantic (a `JobContext`
parameter is injected, not an argument); a pydantic model or TypedDict return
annotation gives an output schema and `structuredContent`. Specs are checked when
they are built, at import time, so a bad signature fails at `celery worker` or
`mcp-celery serve` start, not at the first call.
"""

from __future__ import annotations

import inspect
import json
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, get_type_hints

import pydantic
from celery import Celery, Task
from typing_extensions import is_typeddict

from mcp_celery.core.workflows import WorkflowSummary
from mcp_celery.errors import ToolDefinitionError
from mcp_celery.protocol import TASK_MODES, TaskMode, call_tool_result

__all__ = ["AskFirst", "ToolSpec", "build_input_model", "redelivered_on_loss", "registry", "signature_description"]

#: Questions settled through an MRTR round before a task is created: a fixed mapping of
#: key to input request, or a function of the validated arguments returning one (or None).
AskFirst = Mapping[str, Mapping[str, Any]] | Callable[[dict[str, Any]], Mapping[str, Mapping[str, Any]] | None]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    celery_task: Task[Any, Any]
    input_model: type[pydantic.BaseModel]
    description: str | None = None
    title: str | None = None
    task_mode: TaskMode = "optional"
    context_param: str | None = None
    output_adapter: pydantic.TypeAdapter[Any] | None = None
    terminate_on_cancel: bool = False
    ask_first: AskFirst | None = None
    #: How long a call from a client without the tasks extension waits for the job (None: the setting).
    inline_s: float | None = None
    #: A call without an idempotency key that repeats one still running, created less than this many seconds
    #: ago, gets its task (`mcp_celery.server.engine.repeats`; None: the dedupe_s setting, 0: never).
    dedupe_s: float | None = None
    #: The statusMessage of a running workflow this tool's job handed its task over to (None: the default).
    workflow_summary: WorkflowSummary | None = None
    #: The Celery options `mcp_celery.tool` was given (the others follow the app's configuration,
    #: `mcp_celery.core.task_options`); None for an exposed task, whose options are its own.
    given: frozenset[str] | None = None
    input_schema: dict[str, Any] = field(init=False)
    output_schema: dict[str, Any] | None = field(init=False)
    #: Whether the description was written (given, or the docstring) rather than made from the signature.
    described: bool = field(init=False)

    def __post_init__(self) -> None:
        if self.task_mode not in TASK_MODES:
            raise ToolDefinitionError(
                f"tool {self.name!r}: task mode must be one of {TASK_MODES}, not {self.task_mode!r}"
            )
        if self.inline_s is not None and not self.inline_s > 0:
            raise ToolDefinitionError(f"tool {self.name!r}: inline_s must be a positive number of seconds")
        if self.dedupe_s is not None and not self.dedupe_s >= 0:
            raise ToolDefinitionError(f"tool {self.name!r}: dedupe_s must be a number of seconds (0: off)")
        if self.ask_first is not None and self.task_mode == "forbidden":
            # MRTR answers are delivered to a task; a forbidden tool never has one.
            raise ToolDefinitionError(f"tool {self.name!r}: ask_first needs task mode 'optional' or 'required'")
        object.__setattr__(self, "input_schema", self.input_model.model_json_schema())
        schema = None if self.output_adapter is None else self.output_adapter.json_schema(mode="serialization")
        object.__setattr__(self, "output_schema", schema)
        object.__setattr__(self, "described", bool(self.description))
        if not self.description:  # a model with only a name to go by: give it the call's shape at least
            object.__setattr__(self, "description", signature_description(self.name, self.celery_task.name, self))

    def validate_arguments(self, arguments: Mapping[str, Any] | None) -> dict[str, Any]:
        """Validated arguments as JSON-ready values, ready for a Celery message.

        Raises:
            pydantic.ValidationError: the arguments do not match the input schema.
        """
        return self.input_model.model_validate(dict(arguments or {})).model_dump(mode="json")

    @property
    def redelivered_on_loss(self) -> bool:
        """Whether Celery queues the job again when its worker is lost (`redelivered_on_loss`, below)."""
        return redelivered_on_loss(self.celery_task)

    @property
    def structured(self) -> bool:
        """Whether results carry structuredContent (the tool declares an output schema)."""
        return self.output_schema is not None

    def call_tool_result(self, value: Any) -> dict[str, Any]:
        """The `CallToolResult` for a job's return value (already JSON-ready)."""
        return call_tool_result(value, structured=self.structured)

    @property
    def argsrepr(self) -> str:
        """What Celery's monitors (Flower, `celery inspect`) show as the job's positional arguments.

        MCP jobs get keyword arguments only, so this slot names the tool instead, and Flower finds a
        tool's jobs with `search=args:"[mcp tool NAME]"` whatever the Celery task is called. Not
        `shadow=`: Celery's task-sent event carries the real name and, when it reaches Flower after
        task-received (the producer sends it after publishing), it replaces the shadow name.
        """
        return f"[mcp tool {self.name}]"

    def to_wire(self) -> dict[str, Any]:
        tool: dict[str, Any] = {"name": self.name, "inputSchema": self.input_schema}
        if self.title:
            tool["title"] = self.title
        if self.description:
            tool["description"] = self.description
        if self.output_schema is not None:
            tool["outputSchema"] = self.output_schema
        return tool


def signature_description(tool: str, task_name: str, spec: ToolSpec) -> str:
    """A description for a tool without one: its call, from the input schema, and the Celery task it runs.

    >>> from celery import Celery
    >>> app = Celery(set_as_current=False)
    >>> def add(x: int, y: int = 1) -> int: return x + y
    >>> model, _, out = build_input_model(add, "add", skip=(), context_type=None)
    >>> ToolSpec("add", app.task(add, name="proj.add"), model, output_adapter=out).description
    'add(x: integer, y: integer = 1): runs the Celery task proj.add (it has no docstring).'
    """
    properties: Mapping[str, Any] = spec.input_schema.get("properties") or {}
    parameters = ", ".join(
        f"{name}: {_schema_type(prop)}" + (f" = {json.dumps(prop['default'])}" if "default" in prop else "")
        for name, prop in properties.items()
    )
    returns = "" if spec.output_schema is None else f" -> {_schema_type(spec.output_schema)}"
    return f"{tool}({parameters}){returns}: runs the Celery task {task_name} (it has no docstring)."


def _schema_type(schema: Mapping[str, Any]) -> str:
    if "type" in schema:
        return str(schema["type"]) if schema["type"] != "object" else str(schema.get("title") or "object")
    variants = schema.get("anyOf") or schema.get("oneOf") or []
    return " | ".join(_schema_type(v) for v in variants) or "any"


_REGISTRIES: weakref.WeakKeyDictionary[Celery, dict[str, ToolSpec]] = weakref.WeakKeyDictionary()


def registry(app: Celery) -> dict[str, ToolSpec]:
    """The tools registered on `app`, by MCP tool name."""
    return _REGISTRIES.setdefault(app, {})


def build_input_model(
    fn: Callable[..., Any], tool_name: str, *, skip: tuple[str, ...], context_type: type | None
) -> tuple[type[pydantic.BaseModel], str | None, pydantic.TypeAdapter[Any] | None]:
    """Input model, name of the context parameter, and output adapter for `fn`.

    Raises:
        ToolDefinitionError: a parameter is positional-only or variadic, or an annotation
            cannot be turned into a JSON schema.
    """
    try:
        hints = get_type_hints(fn, include_extras=True)
    except Exception as exc:  # a bad forward reference: say which tool
        raise ToolDefinitionError(f"tool {tool_name!r}: cannot resolve type hints: {exc}") from exc
    fields: dict[str, Any] = {}
    context_param: str | None = None
    for index, (pname, param) in enumerate(inspect.signature(fn).parameters.items()):
        if index == 0 and pname in skip:
            continue
        annotation = hints.get(pname, Any)
        if context_type is not None and annotation is context_type:
            context_param = pname
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise ToolDefinitionError(
                f"tool {tool_name!r}: parameter {pname!r} is {param.kind.description}; "
                "MCP arguments are named, so use ordinary keyword parameters"
            )
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[pname] = (annotation, default)
    try:
        model = pydantic.create_model(f"{tool_name}Arguments", __config__=pydantic.ConfigDict(extra="forbid"), **fields)
        model.model_json_schema()
    except (pydantic.PydanticUserError, pydantic.PydanticSchemaGenerationError, TypeError) as exc:
        raise ToolDefinitionError(f"tool {tool_name!r}: arguments cannot become a JSON schema: {exc}") from exc
    return model, context_param, _output_adapter(hints.get("return"), tool_name)


def _output_adapter(annotation: Any, tool_name: str) -> pydantic.TypeAdapter[Any] | None:
    structured = isinstance(annotation, type) and (
        issubclass(annotation, pydantic.BaseModel) or is_typeddict(annotation)
    )
    if not structured:
        return None
    try:
        adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(annotation)
        adapter.json_schema(mode="serialization")
    except pydantic.PydanticSchemaGenerationError as exc:
        raise ToolDefinitionError(f"tool {tool_name!r}: return type cannot become a JSON schema: {exc}") from exc
    return adapter


def redelivered_on_loss(celery_task: Any) -> bool:
    """Whether Celery queues the job of `celery_task` (a tool's or any task's; None: no such task) again when
    its worker is lost: late ack and reject on worker loss, both. The one place this is decided."""
    return bool(getattr(celery_task, "acks_late", False) and getattr(celery_task, "reject_on_worker_lost", False))
