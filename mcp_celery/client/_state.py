"""What one client process knows about the tasks it watches, shared by the extension and every handle.

Task ids carry enough entropy to be unique across servers, so the watches are keyed by task id alone.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
from mcp.client.session import ClientRequestContext, ClientSession
from mcp_types import ErrorData, InputRequest, InputResponse

from mcp_celery.client._journal import Journal, ServerTarget
from mcp_celery.protocol import DetailedTask

__all__ = ["InputHandler", "TaskState", "TaskWatch"]

logger = logging.getLogger(__name__)

#: Answers one input request; the default routes it through the SDK client's callbacks.
InputHandler = Callable[[ClientRequestContext, InputRequest], Awaitable[InputResponse | ErrorData]]


@dataclass
class TaskWatch:
    """One task as seen from here: the newest pushed state and the input keys already claimed for answering."""

    task_id: str
    latest: DetailedTask | None = None
    claimed_keys: set[str] = field(default_factory=set)
    #: The server acknowledged a `subscriptions/listen` that names this task: pushes will come.
    pushed: bool = False
    _wake: anyio.Event = field(default_factory=anyio.Event)

    def push(self, task: DetailedTask) -> None:
        self.latest = task
        self._wake.set()

    async def next_push(self, timeout: float) -> DetailedTask | None:
        """The state pushed since the last call, waiting up to `timeout` seconds for one; None if none came."""
        with anyio.move_on_after(timeout):
            await self._wake.wait()
        if not self._wake.is_set():
            return None
        self._wake = anyio.Event()
        return self.latest


class TaskState:
    """Watches, the journal and the input handler of one `TasksExtension`."""

    def __init__(
        self, journal: Journal | None, target: ServerTarget | None, input_handler: InputHandler | None
    ) -> None:
        self.journal = journal
        self.target = target
        self.input_handler = input_handler
        #: The HTTP status of the last request the server refused before JSON-RPC (401, 403, 413, 421):
        #: the SDK reports those as -32603 "Server returned an error response", which says nothing.
        self.http_refusal: int | None = None
        #: The server said it honours idempotency keys (`mcp_celery.client._retries`), so a call whose reply
        #: was lost may be sent again; set once connected (`connect()`).
        self.keys_honoured = False
        self._watches: dict[str, TaskWatch] = {}
        self._without_listen: weakref.WeakSet[ClientSession] = weakref.WeakSet()

    def watch(self, task_id: str) -> TaskWatch:
        return self._watches.setdefault(task_id, TaskWatch(task_id))

    def push(self, task: DetailedTask) -> None:
        if (watch := self._watches.get(task.task_id)) is not None:
            watch.push(task)

    def acknowledged(self, task_ids: list[str]) -> None:
        for task_id in task_ids:
            if (watch := self._watches.get(task_id)) is not None:
                watch.pushed = True

    def may_listen(self, session: ClientSession) -> bool:
        return session not in self._without_listen

    def listen_refused(self, session: ClientSession) -> None:
        """The server does not serve `subscriptions/listen` for tasks: poll on this session from now on."""
        self._without_listen.add(session)

    def journal_status(self, task: DetailedTask) -> None:
        if self.journal is not None:
            self.journal.update_status(task.task_id, task.status, task.status_message)
