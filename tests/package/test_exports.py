"""The public surface is exactly `mcp_celery.__all__` (after httpx's test_exported_members.py)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
from mcp.shared.exceptions import MCPError

import mcp_celery
from mcp_celery import client, server, worker
from mcp_celery.client import TaskFailedError
from mcp_celery.errors import NotReplicated, TaskCancelled, jsonrpc_error, protocol_error_of
from mcp_celery.protocol import INTERNAL_ERROR, DetailedTask
from mcp_celery.worker.parking import JobParked
from mcp_celery.worker.workflow import WorkflowStarted


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
    # The client's names pinned, not only matched: an emptied __all__ (and its names gone) fails here too.
    assert {"TaskHandle", "TaskError", "TasksExtension", "connect", "start_task"} <= set(client.__all__)
    assert public_members(client) == set(client.__all__)
    assert mcp_celery.tool is worker.tool and mcp_celery.create_server is server.create_server


def test_every_error_mcp_celery_raises_derives_from_one_base_and_every_job_signal_from_another() -> None:
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
    strays = [c for c in defined if not issubclass(c, (mcp_celery.McpCeleryError, mcp_celery.JobSignal))]
    assert strays == []
    signals = {c.__name__ for c in defined if issubclass(c, mcp_celery.JobSignal)}
    assert signals == {"JobSignal", "TaskCancelled", "JobParked", "WorkflowStarted"}
    assert not issubclass(mcp_celery.JobSignal, Exception)  # a job's `except Exception:` lets each one pass


def test_except_job_signal_lets_every_signal_through_a_handler_that_catches_everything() -> None:
    for signal in (TaskCancelled("t"), JobParked("t"), WorkflowStarted("group", 2)):
        with pytest.raises(type(signal)):
            try:
                raise signal
            except mcp_celery.JobSignal:
                raise
            except BaseException:  # the job's own catch-all, which the signal must get past
                pass


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


def test_the_console_scripts_path_imports() -> None:
    assert importlib.import_module("mcp_celery.cli").main is importlib.import_module("mcp_celery.cli.command").main
