"""The public surface is exactly `mcp_celery.__all__` (after httpx's test_exported_members.py)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

from mcp.shared.exceptions import MCPError

import mcp_celery
from mcp_celery import client, server, worker
from mcp_celery.client import TaskFailedError
from mcp_celery.errors import NotReplicated, jsonrpc_error, protocol_error_of
from mcp_celery.protocol import INTERNAL_ERROR, DetailedTask


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


#: Control flow, not errors: each a BaseException of its own so that a job's `except Exception:` lets it through.
SIGNALS = {"TaskCancelled", "JobParked", "WorkflowStarted"}


def test_every_error_mcp_celery_raises_derives_from_one_base() -> None:
    defined: list[type] = []
    for info in pkgutil.walk_packages(mcp_celery.__path__, "mcp_celery."):
        if info.name.endswith("__main__"):
            continue  # it runs the command line
        module = importlib.import_module(info.name)
        defined.extend(
            value
            for value in vars(module).values()
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == info.name
        )
    assert len(defined) > 10  # the walk reached every tier
    strays = [c for c in defined if not issubclass(c, mcp_celery.McpCeleryError) and c.__name__ not in SIGNALS]
    assert strays == []
    assert not issubclass(mcp_celery.TaskCancelled, Exception)


def test_a_failed_task_is_a_task_error_and_the_sdks_error_at_once() -> None:
    task = DetailedTask.model_validate(
        {
            "taskId": "t",
            "status": "failed",
            "createdAt": "2026-01-01T00:00:00Z",
            "lastUpdatedAt": "2026-01-01T00:00:00Z",
            "error": {"code": -32602, "message": "bad x"},
        }  # fmt: skip
    )
    failed = TaskFailedError(task)
    assert isinstance(failed, client.TaskError) and isinstance(failed, MCPError)
    assert (failed.code, failed.message, str(failed), failed.task) == (-32602, "bad x", "bad x", task)


def test_one_function_maps_an_exception_to_its_json_rpc_error() -> None:
    assert jsonrpc_error(mcp_celery.ProtocolError(-32602, "bad x", {"k": 1})) == (-32602, "bad x", {"k": 1})
    assert jsonrpc_error(NotReplicated("one of two")) == (INTERNAL_ERROR, "one of two: send it again", None)
    assert jsonrpc_error(ConnectionError("down"), store_down=(ConnectionError,))[1].startswith("the task store")
    assert jsonrpc_error(ConnectionRefusedError("redis://:pw@h"))[1].startswith("the broker or Redis is unreachable")
    assert jsonrpc_error(ValueError("redis://:pw@h"))[1] == "internal error (the server log has the details)"
    assert "pw" not in jsonrpc_error(ValueError("redis://:pw@h"), debug=True)[1]
    assert protocol_error_of({"exc_type": "ProtocolError", "exc_message": [-32001, "no"]}) is not None
    assert protocol_error_of({"exc_type": "ValueError", "exc_message": [-32001, "no"]}) is None


def test_the_module_paths_the_guides_gave_still_import() -> None:
    """Moved modules whose old path the docs gave (or a console script names) still answer to it."""
    demo = importlib.import_module("mcp_celery.demo_jobs")
    assert demo.app is importlib.import_module("mcp_celery.cli.demo_jobs").app
    for old, new in (("metrics", "ops.metrics"), ("deployment_metrics", "ops.deployment_metrics")):
        moved = importlib.import_module(f"mcp_celery.server.{new}")
        assert importlib.import_module(f"mcp_celery.server.{old}") is moved
    assert importlib.import_module("mcp_celery.cli").main is importlib.import_module("mcp_celery.cli.command").main
