"""A worker's log lines as JSON (MCP_CELERY_LOG_FORMAT=json), each with the task fields of its job.

Worker tier. Celery sets up a worker's logging itself (prefork children inherit it) and hands
the loggers it configured to its `after_setup_logger` and `after_setup_task_logger` signals:
their handlers get `mcp_celery.logs.JsonFormatter` and a filter that adds the running job's
task id, tool and hashed principal to every line, the job's own logging included. Celery's line
for a job that succeeded quotes its return value: in JSON the filter leaves the value out.
"""

from __future__ import annotations

import logging
from typing import Any

from mcp_celery.logs import JsonFormatter
from mcp_celery.worker.config import worker_settings
from mcp_celery.worker.context import current_context

__all__ = ["JobFields", "json_lines"]

#: What Celery's success line (celery.app.trace LOG_SUCCESS) shows instead of the return value.
NOT_LOGGED = "(not logged)"


class JobFields(logging.Filter):
    """Adds the running job's task fields to each record; keeps Celery's success line free of the result."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = current_context()
        if ctx is not None:
            for name, value in ctx.log_fields.items():
                if not hasattr(record, name):
                    setattr(record, name, value)
        # celery.app.trace logs `fmt % context` and passes the context as extra={"data": context} too.
        data = getattr(record, "data", None)
        if isinstance(data, dict) and "return_value" in data and isinstance(record.args, dict):
            record.args = {**record.args, "return_value": NOT_LOGGED}
        return True


def json_lines(logger: logging.Logger | None = None, **_: Any) -> None:
    """Celery's `after_setup_(task_)logger`: with MCP_CELERY_LOG_FORMAT=json, JSON lines with the job's fields."""
    if logger is None or worker_settings().log_format != "json":
        return
    for handler in logger.handlers:
        handler.setFormatter(JsonFormatter())
        if not any(isinstance(f, JobFields) for f in handler.filters):
            handler.addFilter(JobFields())
