"""Finding a Celery app from `-A module[:app]`, as `celery -A` does.

Tier 1 (celery). Shared by `mcp-celery serve` and the HTTP app factory of `serve --workers N`.
"""

from __future__ import annotations

import importlib
import sys

from celery import Celery

from mcp_celery.errors import ConfigurationError

__all__ = ["load_app"]


def load_app(spec: str) -> Celery:
    """Import `module` or `module:attribute` and return its Celery app, as `celery -A` does.

    Raises:
        ConfigurationError: nothing importable there, or no Celery app in it.
    """
    module_name, _, attribute = spec.partition(":")
    if "" not in sys.path:
        sys.path.insert(0, "")  # like celery -A: the current directory is importable
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r}: {exc}") from exc
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
