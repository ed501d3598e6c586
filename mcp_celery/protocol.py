"""SEP-2663 wire vocabulary: the extension id, status names, error codes and result shapes.

Tier 0: imports only the standard library and `mcp_types`. Everything that reaches the
wire as a task is built here, so the flat `CreateTaskResult` and the per-status
`DetailedTask` shapes are written once.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from mcp_types import (
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
)

__all__ = [
    "CLIENT_CAPABILITIES_META",
    "HEADER_MISMATCH",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "MISSING_REQUIRED_CLIENT_CAPABILITY",
    "TASKS_EXTENSION",
    "TERMINAL_STATUSES",
    "TaskMode",
    "TaskStatus",
    "iso_ms",
    "missing_capability_data",
]

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
CLIENT_CAPABILITIES_META = "io.modelcontextprotocol/clientCapabilities"

TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]
TERMINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed", "cancelled"})

#: How a tool runs: "optional" is a task when the request declares the extension, else
#: synchronous; "required" refuses non-declaring requests with -32021; "forbidden" is
#: always synchronous.
TaskMode = Literal["optional", "required", "forbidden"]


def iso_ms(epoch_ms: int) -> str:
    """RFC 3339 timestamp with an explicit UTC offset, millisecond precision."""
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def missing_capability_data() -> dict[str, Any]:
    """The `data` member of a -32021 error; the 2026-07-28 schema requires it."""
    return {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}}
