"""Finding a Celery app from `-A module[:app]`, as `celery -A` does.

Tier 1 (celery). Shared by `mcp-celery serve` and the HTTP app factory of `serve --workers N`.
"""

from __future__ import annotations

import importlib
import sys

from celery import Celery
from celery.exceptions import NotRegistered

from mcp_celery.errors import ConfigurationError

__all__ = ["load_app"]


def load_app(spec: str) -> Celery:
    """Import `module` or `module:attribute` and return its Celery app, as `celery -A` does.

    Raises:
        ConfigurationError: nothing importable there, no Celery app in it, or it names a Celery task
            that is not registered (its module was not imported).
    """
    module_name, _, attribute = spec.partition(":")
    if "" not in sys.path:
        sys.path.insert(0, "")  # like celery -A: the current directory is importable
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r}: {exc}") from exc
    except NotRegistered as exc:  # app.tasks["proj.tasks.add"] before proj.tasks was imported
        raise ConfigurationError(
            f"importing {module_name!r}: Celery has no task {exc}; import the module that defines it first "
            "(or pass the task itself to mcp_celery.expose)"
        ) from exc
    candidates = [attribute] if attribute else ["app", "celery"]
    for name in candidates:
        found = getattr(module, name, None)
        if isinstance(found, Celery):
            return found
    apps = [v for v in vars(module).values() if isinstance(v, Celery)]
    if not attribute and len(apps) == 1:
        return apps[0]
    raise ConfigurationError(
        f"no Celery app {'named ' + repr(attribute) if attribute else ''} found in {module_name!r}"
    )
