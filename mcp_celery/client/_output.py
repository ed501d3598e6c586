"""`mcp-celery call`'s live output: a task's output resource followed while it runs.

The output is `mcp-celery://tasks/{taskId}/output` (text/plain, its last bytes kept after a line
that says how many were dropped: `protocol.output_dropped`). A `subscriptions/listen` with that URI
in `resourceSubscriptions` tells when it grew (batched by the server, at most 4 a second); each
update reads it again and shows the complete lines not shown yet, by their offset in the whole
output, so a line is shown once however often it is read. A server that acknowledges no such
subscription (another SEP-2663 server, an older revision) is read once a second instead; one that
has no output resource at all shows nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio
from mcp.client.session import ClientSession
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost, listen
from mcp.shared.exceptions import MCPError
from mcp_types import TextResourceContents

from mcp_celery.protocol import output_dropped, output_uri

__all__ = ["OutputFollower"]

logger = logging.getLogger(__name__)

#: How often a server that pushes no updates is read.
_POLL_S = 1.0


class OutputFollower:
    """Shows each complete line of a task's live output once, through `show`."""

    def __init__(self, session: ClientSession, task_id: str, show: Callable[[str], None]) -> None:
        self.session = session
        self.uri = output_uri(task_id)
        self._show = show
        self._shown = 0  # bytes of the whole output (dropped ones included) shown as lines so far
        self._missing = False  # the server has no output resource for the task

    async def follow(self) -> None:
        """Show new lines as they come until cancelled (or the server ends the subscription with the task)."""
        try:
            async with listen(self.session, resource_subscriptions=[self.uri]) as updates:
                if self.uri in (updates.honored.resource_subscriptions or []):
                    await self.catch_up()
                    async for _ in updates:
                        await self.catch_up()
                    return
        except (MCPError, ListenNotSupportedError, SubscriptionLost) as exc:
            logger.debug("no output subscription (%s); reading the output every %s s", exc, _POLL_S)
        while not self._missing:
            await self.catch_up()
            await anyio.sleep(_POLL_S)

    async def catch_up(self, *, final: bool = False) -> None:
        """Read the output and show the complete lines not shown yet (`final`: a last line without its newline too)."""
        if self._missing:
            return
        try:
            result = await self.session.read_resource(self.uri)
        except MCPError:
            self._missing = True  # not this server's, or the task is gone: nothing to show
            return
        texts = [item.text for item in result.contents if isinstance(item, TextResourceContents)]
        if not texts:
            return
        dropped, kept = output_dropped(texts[0])
        data = kept.encode()
        if self._shown < dropped:
            self._show(f"[{dropped - self._shown:,} bytes of output dropped before they were shown]")
            self._shown = dropped
        new = data[self._shown - dropped :]
        complete = new if final else new[: new.rfind(b"\n") + 1]
        for line in complete.decode(errors="replace").splitlines():
            self._show(line)
        self._shown += len(complete)
