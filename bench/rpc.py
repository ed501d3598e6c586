"""Raw JSON-RPC over Streamable HTTP, 2026-07-28 framing: one stateless POST per request.

Every request carries the `_meta` envelope in its params and the MCP-Protocol-Version / Mcp-Method /
Mcp-Name headers. The async helpers drive the load windows; `SyncClient` serves the threaded
input-latency probe. Nothing here knows about tasks beyond the method names.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from typing import Any

import httpx

PROTOCOL = "2026-07-28"
TASKS_EXT = "io.modelcontextprotocol/tasks"


def envelope(capabilities: Mapping[str, Any]) -> dict[str, Any]:
    """The `_meta` a 2026-07-28 client puts in every request's params."""
    return {
        "io.modelcontextprotocol/protocolVersion": PROTOCOL,
        "io.modelcontextprotocol/clientCapabilities": dict(capabilities),
    }


META_DECLARED = envelope({"extensions": {TASKS_EXT: {}}})  # the tasks extension declared
META_PLAIN = envelope({})  # nothing declared: the server answers synchronously
_ids = itertools.count(1)


class RpcError(Exception):
    """A JSON-RPC error, a non-200 answer or a body that is not a JSON-RPC result."""


def request(
    method: str, params: Mapping[str, Any], name: str, declare: bool = True, *, meta: Mapping[str, Any] | None = None
) -> tuple[dict[str, str], bytes]:
    """Headers and body of one request; `meta` overrides the declared/plain envelope."""
    body = {
        "jsonrpc": "2.0",
        "id": next(_ids),
        "method": method,
        "params": {**params, "_meta": meta if meta is not None else (META_DECLARED if declare else META_PLAIN)},
    }
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": PROTOCOL,
        "Mcp-Method": method,
        "Mcp-Name": name,
    }
    return headers, json.dumps(body, separators=(",", ":")).encode()


def parse(resp: httpx.Response) -> dict[str, Any]:
    """The `result` of a JSON-RPC answer (plain JSON or SSE-framed).

    Raises:
        RpcError: an error answer, a non-200 status or a body without a result.
    """
    ctype = resp.headers.get("content-type", "")
    text = resp.text
    if ctype.startswith("text/event-stream"):  # tolerate SSE framing: take the last data: line
        data = [ln[5:].strip() for ln in text.splitlines() if ln.startswith("data:")]
        if not data:
            raise RpcError(f"HTTP {resp.status_code}: empty SSE body")
        text = data[-1]
    try:
        msg = json.loads(text)
    except ValueError as e:
        raise RpcError(f"HTTP {resp.status_code}: non-JSON body {text[:200]!r}") from e
    if "error" in msg:
        raise RpcError(f"HTTP {resp.status_code}: {msg['error']}")
    if resp.status_code != 200 or "result" not in msg:
        raise RpcError(f"HTTP {resp.status_code}: {text[:200]}")
    return dict(msg["result"])


def new_client() -> httpx.AsyncClient:
    """One keep-alive connection: each concurrent load worker owns one."""
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    return httpx.AsyncClient(timeout=httpx.Timeout(30.0), limits=limits)


async def rpc(
    client: httpx.AsyncClient, url: str, method: str, params: dict[str, Any], name: str, declare: bool = True
) -> dict[str, Any]:
    headers, body = request(method, params, name, declare)
    resp = await client.post(url, content=body, headers=headers)
    return parse(resp)


async def call_tool(
    client: httpx.AsyncClient, url: str, tool: str, args: dict[str, Any], declare: bool = True
) -> dict[str, Any]:
    return await rpc(client, url, "tools/call", {"name": tool, "arguments": args}, tool, declare)


async def tasks_get(client: httpx.AsyncClient, url: str, task_id: str) -> dict[str, Any]:
    return await rpc(client, url, "tasks/get", {"taskId": task_id}, task_id)


class SyncClient:
    """The same requests from a blocking client, with one set of declared capabilities for all of them."""

    def __init__(self, url: str, capabilities: Mapping[str, Any]) -> None:
        self.url = url
        self.meta = envelope(capabilities)
        self.http = httpx.Client(timeout=30)

    def result(self, method: str, params: dict[str, Any], name: str) -> dict[str, Any]:
        headers, body = request(method, params, name, meta=self.meta)
        return parse(self.http.post(self.url, content=body, headers=headers))

    def start(self, tool: str, args: dict[str, Any]) -> str:
        """tools/call that must come back as a task; returns its id."""
        handle = self.result("tools/call", {"name": tool, "arguments": args}, tool)
        if handle.get("resultType") != "task":
            raise RpcError(f"not a task: {handle}")
        return str(handle["taskId"])

    def get(self, task_id: str) -> dict[str, Any]:
        return self.result("tasks/get", {"taskId": task_id}, task_id)

    def close(self) -> None:
        self.http.close()
