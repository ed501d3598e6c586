"""Log lines as JSON objects (`--log-format json`, MCP_CELERY_LOG_FORMAT=json), and the fields of a task.

Tier 0: standard library only, for the server, the worker and the CLI alike. Every change of a
task's status is logged (INFO) where it happens, with `extra=task_fields(...)`: the task id, the
tool, the new MCP status, what happened (`event`), and the principal as a digest, never its name.
The JSON formatter writes those fields and a fixed set of others, never the rest of a record's
`extra` (Celery passes a job's arguments and return value there): no log line of ours carries a
tool's arguments, an answer to an input request or a result.
"""

from __future__ import annotations

import hashlib
import json
import logging
import logging.config
import sys
from datetime import UTC, datetime
from typing import Any, Literal

from mcp_celery.redact import redact

__all__ = [
    "FIELDS",
    "announce",
    "JsonFormatter",
    "LogFormat",
    "configure",
    "dict_config",
    "key_digest",
    "principal_digest",
    "task_fields",
    "uvicorn_options",
]

LogFormat = Literal["text", "json"]
#: The task fields a JSON line carries when the record has them.
FIELDS = ("task_id", "tool", "principal", "status", "event", "idempotency_key")
#: The text format of `mcp-celery serve` (logging.basicConfig's).
TEXT_FORMAT = "%(levelname)s:%(name)s:%(message)s"


def principal_digest(principal: str) -> str:
    """A stable pseudonym of a principal for logs: tells callers apart without naming them.

    A digest of a guessable name can be matched by guessing: it keeps names out of log
    storage, it is not a secret.

    >>> principal_digest("alice")
    'sha256:2bd806c97f0e00af'
    """
    return "sha256:" + hashlib.sha256(principal.encode()).hexdigest()[:16]


def key_digest(key: str) -> str:
    """An idempotency key as logs show it: its digest, never the key (which a client may reuse as a secret).

    >>> key_digest("k-1")
    'sha256:7c35c5a1785d2070'
    """
    return principal_digest(key)


def task_fields(
    task_id: str,
    tool: str | None = None,
    *,
    principal: str | None = None,
    status: str | None = None,
    event: str | None = None,
    idempotency_key: str | None = None,
) -> dict[str, str]:
    """The `extra=` of a log call about one task (`principal` and `idempotency_key` are digested here).

    `status`: the task's new MCP status, when this changes it; `event`: what happened (created,
    started, input_required, answered, cancel, ended, lost, interrupted, repeated).
    """
    fields = {"task_id": task_id}
    if event is not None:
        fields["event"] = event
    if tool is not None:
        fields["tool"] = tool
    if principal is not None:
        fields["principal"] = principal_digest(principal)
    if status is not None:
        fields["status"] = status
    if idempotency_key is not None:
        fields["idempotency_key"] = key_digest(idempotency_key)
    return fields


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the task fields, an exception's text.

    Passwords in URLs are redacted from the message and the traceback (`mcp_celery.redact`).
    """

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        for field in FIELDS:
            value = getattr(record, field, None)
            if value is not None:
                entry[field] = value
        if record.exc_info:
            entry["exception"] = redact(self.formatException(record.exc_info))
        return json.dumps(entry, default=str)


def dict_config(level: str, log_format: LogFormat) -> dict[str, Any]:
    """A `logging.config.dictConfig` for a server process: the root logger on stderr in `log_format`.

    Uvicorn's own loggers propagate to it (uvicorn applies this in each of its worker processes).
    """
    # By name, not by object: uvicorn pickles the config into the worker processes it spawns.
    json_formatter = {"()": f"{__name__}.JsonFormatter"}
    formatter: dict[str, Any] = json_formatter if log_format == "json" else {"format": TEXT_FORMAT}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"mcp_celery": formatter},
        "handlers": {
            "stderr": {"class": "logging.StreamHandler", "formatter": "mcp_celery", "stream": "ext://sys.stderr"}
        },
        "root": {"level": level.upper(), "handlers": ["stderr"]},
        "loggers": {
            name: {"handlers": [], "propagate": True} for name in ("uvicorn", "uvicorn.error", "uvicorn.access")
        },
    }


#: The JSON config `configure` applied in this process, for uvicorn to apply in its own processes.
_uvicorn_config: dict[str, Any] | None = None


def configure(level: str, log_format: LogFormat) -> None:
    """Set up this process's logging: the root logger on stderr, `level`, `log_format`."""
    global _uvicorn_config
    config = dict_config(level, log_format)
    logging.config.dictConfig(config)
    _uvicorn_config = config if log_format == "json" else None


def announce(message: str) -> None:
    """Tell the operator `message` on stderr whatever the log level: "mcp-celery: MESSAGE" in text,
    a JSON line (level INFO, logger mcp_celery) under `--log-format json`, so a log collector reading
    JSON lines reads every line."""
    if _uvicorn_config is None:
        print(f"mcp-celery: {message}", file=sys.stderr, flush=True)
        return
    record = logging.LogRecord("mcp_celery", logging.INFO, __file__, 0, message, None, None)
    print(JsonFormatter().format(record), file=sys.stderr, flush=True)


def uvicorn_options() -> dict[str, Any]:
    """`uvicorn.run` keywords for the logging `configure` set up ({}: uvicorn's own text logs)."""
    return {} if _uvicorn_config is None else {"log_config": _uvicorn_config}
