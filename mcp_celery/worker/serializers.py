"""What `configure_app`'s JSON-only setting breaks in an app that used pickle, told at worker start.

Worker tier. `configure_app` sets `accept_content`, `result_accept_content`, `task_serializer` and
`result_serializer` to JSON: a worker then refuses a pickle message (it logs and drops it), since
unpickling runs whatever code the message carries. An app that used pickle before would see its
pickle tasks silently never run, so the worker says so when it starts, naming each setting that
`configure_app` replaced and each task that still sends a serialization the worker refuses.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from celery import Celery
from kombu.serialization import registry as serializers  # type: ignore[attr-defined]  # not in the stubs

__all__ = ["JSON_ONLY", "remember_replaced", "warn_about_refused_serializers"]

logger = logging.getLogger(__name__)

#: The serialization settings configure_app sets.
JSON_ONLY: dict[str, Any] = {
    "accept_content": ["json"],
    "result_accept_content": ["json"],
    "task_serializer": "json",
    "result_serializer": "json",
}

_REPLACED: weakref.WeakKeyDictionary[Celery, dict[str, Any]] = weakref.WeakKeyDictionary()


def remember_replaced(app: Celery) -> None:
    """Before configure_app's update: note the settings that allowed more than JSON, with their values."""
    replaced = {}
    for setting, json_only in JSON_ONLY.items():
        value = app.conf[setting]
        if value is not None and _names(value) - _names(json_only):
            replaced[setting] = value
    if replaced:
        _REPLACED.setdefault(app, {}).update(replaced)


def warn_about_refused_serializers(app: Celery) -> None:
    """Log one warning for the replaced settings and one for the tasks whose messages this worker refuses."""
    replaced = _REPLACED.get(app, {})
    if replaced:
        was = ", ".join(f"{setting} was {value!r}" for setting, value in replaced.items())
        logger.warning(
            "configure_app made this app JSON-only (%s): a pickle message is refused (logged and dropped), so "
            "tasks still sent with pickle never run; set accept_content after configure_app to take them "
            "(unpickling runs whatever code a message carries)",
            was,
        )
    accepted = _names(app.conf.accept_content or [])
    refused = sorted(
        f"{name} ({task.serializer})"
        for name, task in app.tasks.items()
        if not name.startswith("celery.") and task.serializer and task.serializer not in accepted
    )
    if refused:
        logger.warning(
            "tasks %s serialize their messages in a way this worker refuses (accept_content is %r): "
            "their messages are dropped unrun; give them serializer='json' or accept it",
            ", ".join(refused),
            app.conf.accept_content,
        )


def _names(value: Any) -> set[str]:
    """Serializer names (`pickle`), as Celery accepts them: a name or a list of names or content types."""
    items = [value] if isinstance(value, str) else list(value)
    return {str(serializers.type_to_name.get(item, item)) for item in items}
