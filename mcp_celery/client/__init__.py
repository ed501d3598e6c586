"""A client for MCP servers that run tool calls as tasks (SEP-2663), this project's or any other.

    extension = TasksExtension(journal=Journal(), target=ServerTarget(url=URL))
    async with connect(extension.state.target, extension, elicitation_callback=ask) as client:
        result = await client.call_tool("slow_compute", {"seconds": 5})      # waits the task out
        handle = await extension.start(client, "slow_compute", {"seconds": 60})
        print((await handle.status()).status_message)
        await handle.cancel()

Over HTTP every `tools/call` carries a fresh idempotency key, and a call whose reply is lost (the connection
broke or timed out first) is sent again with it, which a server that honours keys answers with the first
call's task: `connect(..., retries=Retries(attempts=4))` (the default), `retries=NO_RETRIES` never does.

Sampling requests (a job asking the client's model) go to `sampling_callback=`: `OpenAISampler(url, model)`
for an OpenAI-compatible endpoint (Ollama, vLLM, llama.cpp), `CommandSampler(command)` for a program,
both with tool use (`sampling_capabilities=SAMPLING_WITH_TOOLS`).

Needs only `mcp`: importing it imports neither celery nor redis. The wire models it reads and sends
(`DetailedTask`, `CreateTaskResult`, the `tasks/*` requests) are the server's too, in `mcp_celery.protocol`.

    _extension.py   TasksExtension: the client half of the extension on the SDK's ClientExtension seam
    _handle.py      TaskHandle: start, status, wait, result, cancel, answer
    _state.py       what one client process knows of the tasks it watches
    _errors.py      TaskError and its kinds (under `mcp_celery.errors.McpCeleryError`)
    _journal.py     the local journal of started tasks (SQLite)
    _retries.py     idempotency keys, and calls sent again when their reply is lost
    _sampling.py    CommandSampler; _openai.py OpenAISampler: answering sampling requests
    _terminal.py    the progress line and prompts of `mcp-celery call`
    _output.py      the live output `mcp-celery call` shows: a task's output resource followed
    _cli.py         `mcp-celery call` and `mcp-celery tasks list|get|wait|cancel`
    _artifacts.py   `tasks get --save DIR`: a task's artifacts downloaded (HTTP) or read (stdio)
"""

from mcp_celery.client._errors import (
    NotATaskError,
    TaskCancelledError,
    TaskError,
    TaskFailedError,
    TaskInputError,
)
from mcp_celery.client._extension import TasksExtension, connect
from mcp_celery.client._handle import TaskHandle, start_task
from mcp_celery.client._journal import JOURNAL_ENV, Journal, JournalEntry, ServerTarget, default_journal_path
from mcp_celery.client._openai import OpenAISampler
from mcp_celery.client._retries import NO_RETRIES, Retries
from mcp_celery.client._sampling import SAMPLING_WITH_TOOLS, CommandSampler
from mcp_celery.protocol import TASKS_EXTENSION as TASKS_EXTENSION_ID
from mcp_celery.protocol import TERMINAL_STATUSES, CreateTaskResult, DetailedTask, TaskStatus

__all__ = [
    "JOURNAL_ENV",
    "NO_RETRIES",
    "SAMPLING_WITH_TOOLS",
    "TASKS_EXTENSION_ID",
    "TERMINAL_STATUSES",
    "CommandSampler",
    "CreateTaskResult",
    "DetailedTask",
    "Journal",
    "JournalEntry",
    "NotATaskError",
    "OpenAISampler",
    "Retries",
    "ServerTarget",
    "TaskCancelledError",
    "TaskError",
    "TaskFailedError",
    "TaskHandle",
    "TaskInputError",
    "TaskStatus",
    "TasksExtension",
    "connect",
    "default_journal_path",
    "start_task",
]
