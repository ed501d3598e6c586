"""A TCP proxy on loopback that loses the reply to a `tools/call`: the lost reply of issue 47, made on purpose.

It forwards every HTTP request from a client to an HTTP server (whole, one at a time) and every byte
back, except that after it has forwarded a request that names `tools/call` (the `Mcp-Method` header or
the JSON body), it waits until the server
answers (its first reply byte, or `drop_now()` from the test while the server still waits on a job)
and then closes both connections without passing the reply on: the server has done the work, the
client has no answer. `drops` says how many replies it loses before it forwards faithfully.

It runs its own asyncio loop on a thread, so tests drive it from synchronous code; loopback only.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["DroppingProxy", "dropping_proxy"]

#: What marks a request as a tools/call on the wire: the 2026-07-28 header, or the body's method.
TOOLS_CALL_MARKS = (b"tools/call",)
CHUNK = 65536


class DroppingProxy:
    """Forwards 127.0.0.1:`port` to `upstream_port`, losing the replies to the first `drops` tools/call requests."""

    def __init__(self, upstream_port: int, drops: int = 1) -> None:
        self.upstream_port = upstream_port
        self.drops_left = drops
        #: tools/call requests whose reply this proxy dropped.
        self.dropped = 0
        #: tools/call requests it saw (forwarded to the server), dropped or not.
        self.calls_seen = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._drop_now: asyncio.Event | None = None
        self._stopping: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dropping-proxy", daemon=True)

    def start(self) -> None:
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the proxy did not start")

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(lambda: self._stopping.set() if self._stopping else None)
        self._thread.join(10)

    def drop_now(self) -> None:
        """Lose the reply the armed connection waits for now, without waiting for its first byte."""
        self._loop.call_soon_threadsafe(lambda: self._drop_now.set() if self._drop_now else None)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _main(self) -> None:
        self._drop_now, self._stopping = asyncio.Event(), asyncio.Event()
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._started.set()
        await self._stopping.wait()
        server.close()
        pending = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_w.close()
            return
        armed = asyncio.Event()  # a tools/call went upstream on this connection, and its reply is to be lost
        up = asyncio.create_task(self._upstream(client_r, server_w, armed))
        down = asyncio.create_task(self._downstream(server_r, client_w, armed))
        await asyncio.wait([up, down], return_when=asyncio.FIRST_COMPLETED)
        for task in (up, down):
            task.cancel()
        for writer in (client_w, server_w):
            writer.close()

    async def _upstream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, armed: asyncio.Event) -> None:
        """Forward the client's requests one whole HTTP request at a time (clients send a Content-Length)."""
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
                body = await reader.readexactly(_content_length(head))
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                return
            if any(mark in head + body for mark in TOOLS_CALL_MARKS):
                self.calls_seen += 1
                if self.drops_left > 0:  # armed before it is forwarded: no reply can slip through first
                    self.drops_left -= 1
                    assert self._drop_now is not None
                    self._drop_now.clear()
                    armed.set()
            writer.write(head + body)
            await writer.drain()

    async def _downstream(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, armed: asyncio.Event
    ) -> None:
        assert self._drop_now is not None
        read = asyncio.ensure_future(reader.read(CHUNK))
        try:
            while True:
                told = asyncio.ensure_future(self._drop_now.wait())
                await asyncio.wait([read, told], return_when=asyncio.FIRST_COMPLETED)
                told.cancel()
                if armed.is_set():
                    self.dropped += 1
                    return  # the reply (or its first bytes) is lost: both connections close
                if not read.done():
                    self._drop_now.clear()  # told while no tools/call waits here: nothing to lose
                    continue
                data = read.result()
                if not data:
                    return
                writer.write(data)
                await writer.drain()
                read = asyncio.ensure_future(reader.read(CHUNK))
        finally:
            read.cancel()


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


@contextmanager
def dropping_proxy(upstream_url: str, drops: int = 1) -> Iterator[DroppingProxy]:
    """A `DroppingProxy` in front of the HTTP MCP server at `upstream_url`, stopped on leaving."""
    port = int(upstream_url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
    proxy = DroppingProxy(port, drops)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()
