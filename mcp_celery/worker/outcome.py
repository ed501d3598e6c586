"""A job's outcome, in the shape of Celery's result meta, for mcp-celery's own record.

Worker tier. The record holds `{"status": "SUCCESS" | "FAILURE" | "REVOKED", "result": ...,
"traceback": ..., "date_done": ...}` as Celery's JSON result meta would, exceptions as
`{"exc_type": ..., "exc_message": [args]}`, so that `mcp_celery.core.status` maps one shape whatever
Celery's own result backend is (or whether there is one).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

__all__ = ["failed", "revoked", "succeeded"]


def succeeded(value: Any) -> dict[str, Any]:
    return _meta("SUCCESS", value)


def failed(exc: BaseException, traceback: str | None = None) -> dict[str, Any]:
    encoded = {"exc_type": type(exc).__name__, "exc_module": type(exc).__module__, "exc_message": list(exc.args)}
    return _meta("FAILURE", encoded, traceback)


def revoked(reason: str) -> dict[str, Any]:
    return _meta("REVOKED", {"exc_type": "TaskRevokedError", "exc_message": [reason]})


def _meta(status: str, result: Any, traceback: str | None = None) -> dict[str, Any]:
    return {"status": status, "result": result, "traceback": traceback, "date_done": datetime.now(UTC).isoformat()}
