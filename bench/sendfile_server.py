"""The ceiling of a download over loopback HTTP: one file, answered to every GET with sendfile(2).

Run: python -m bench.sendfile_server PORT PATH

No Python touches the bytes (asyncio's `loop.sendfile`: the kernel copies the page cache into the
socket), no headers but Content-Length: the least an HTTP server can do to hand over a file. A client
downloading from it is bounded by itself and the loopback TCP path only (`bench.artifact_download`).
"""

from __future__ import annotations

import asyncio
import os
import sys


async def serve(port: int, path: str) -> None:
    size = os.path.getsize(path)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n" % size

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(head)
                await writer.drain()
                with open(path, "rb") as file:
                    await asyncio.get_running_loop().sendfile(writer.transport, file)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]), sys.argv[2]))
