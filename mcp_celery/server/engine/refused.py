"""Jobs a worker refused because their task is in another store, read from Celery's result backend.

Server tier, for the reaper. A worker whose task store is not the server's cannot reach the task's
record (it knows the server's store only by `store_identity`, a digest), so it refuses the job with
a Celery failure, `StoreMismatch`, naming both stores (`mcp_celery.worker.execution`). Celery keeps
that failure in its result backend, which the server and the worker share; the reaper reads the
Celery state of the unstarted tasks it looks at, and ends a refused one `failed` with the worker's
words within seconds, rather than reporting its message lost a minute later. Without a result
backend (or one that does not answer) nothing is found here, and the message is reported lost.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import anyio

from mcp_celery.errors import StoreMismatch

__all__ = ["refusals"]

logger = logging.getLogger(__name__)


async def refusals(app: Any, task_ids: Sequence[str]) -> dict[str, str]:
    """The tasks among `task_ids` whose job a worker refused for its store: task id -> the worker's message."""
    if not task_ids:
        return {}
    return await anyio.to_thread.run_sync(_read, app, list(task_ids))


def _read(app: Any, task_ids: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for task_id in task_ids:
        try:
            meta = app.backend.get_task_meta(task_id)
        except Exception:  # noqa: BLE001 - no result backend (DisabledBackend), or it is down: nothing to read
            logger.debug("could not read Celery's state of task %s", task_id, exc_info=True)
            return found
        message = _refusal(meta)
        if message is not None:
            found[task_id] = message
    return found


def _refusal(meta: Mapping[str, Any]) -> str | None:
    """The worker's message when Celery's state is a `StoreMismatch` failure.

    Celery rebuilds a stored exception by its module and name (a class of that name when it cannot
    import it), or leaves its JSON form; the type is known by name, whichever it is.
    """
    if meta.get("status") != "FAILURE":
        return None
    result = meta.get("result")
    if isinstance(result, BaseException) and type(result).__name__ == StoreMismatch.__name__:
        return str(result.args[0]) if result.args else str(result)
    if isinstance(result, Mapping) and result.get("exc_type") == StoreMismatch.__name__:
        args = result.get("exc_message")
        return str(args[0]) if isinstance(args, list) and args else str(args)
    return None
