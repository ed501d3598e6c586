"""The `mcp-celery` command; `main` is loaded lazily, so that this package alone loads nothing."""

import importlib as _importlib
import typing as _typing

__all__ = ["main"]


def __getattr__(name: str) -> _typing.Any:
    if name != "main":
        raise AttributeError(f"module 'mcp_celery.cli' has no attribute {name!r}")
    return _importlib.import_module("mcp_celery.cli.command").main
