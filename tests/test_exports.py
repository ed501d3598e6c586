"""The public surface is exactly `mcp_celery.__all__` (after httpx's test_exported_members.py)."""

from __future__ import annotations

import inspect

import mcp_celery
from mcp_celery import client, server, worker


def public_members(module: object) -> set[str]:
    return {name for name, value in vars(module).items() if not name.startswith("_") and not inspect.ismodule(value)}


def test_all_is_exactly_the_public_names_once_every_lazy_name_is_loaded() -> None:
    for name in mcp_celery.__all__:
        assert getattr(mcp_celery, name) is not None, name
    assert public_members(mcp_celery) == set(mcp_celery.__all__) - {"__version__"}
    assert mcp_celery.__all__ == sorted(mcp_celery.__all__)
    assert dir(mcp_celery) == mcp_celery.__all__


def test_unknown_names_are_attribute_errors() -> None:
    try:
        mcp_celery.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("mcp_celery.no_such_name did not raise")


def test_each_tier_declares_its_public_names() -> None:
    assert public_members(worker) == set(worker.__all__)
    assert set(server.__all__) == {"create_server"}
    assert client.__all__ == [] or public_members(client) == set(client.__all__)
    assert mcp_celery.tool is worker.tool and mcp_celery.create_server is server.create_server
