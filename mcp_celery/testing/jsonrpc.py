"""Raw JSON-RPC clients for the 2026-07-28 wire, over Streamable HTTP and stdio: the demo's and the tests'.

Tier 4 (tooling), standard library only, so that `mcp-celery demo` runs from a plain install.
It sends exactly what a 2026-07-28 client sends (the `_meta` envelope, the Mcp-Method and
Mcp-Name headers, one POST per request) and hands back the raw reply, so callers see the wire
as it is. Real applications use `mcp_celery.client` or any MCP SDK instead.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from mcp_celery.protocol import TERMINAL_STATUSES, client_capabilities, request_body, request_headers
from mcp_celery.testing.processes import stop_group

__all__ = ["HttpReply", "RawHttpClient", "RawStdioClient", "SseStream"]


@dataclass(frozen=True)
class HttpReply:
    """One HTTP response: its status, headers and body."""

    status_code: int
    headers: Mapping[str, str]
    text: str

    def json(self) -> Any:
        """The body as JSON; for an SSE body, the last `data:` event (the JSON-RPC reply)."""
        if self.headers.get("content-type", "").startswith("text/event-stream"):
            return self.messages()[-1]
        return json.loads(self.text)

    def messages(self) -> list[Any]:
        """Every JSON-RPC message of the body, in order: an SSE body's notifications, then its reply."""
        if not self.headers.get("content-type", "").startswith("text/event-stream"):
            return [json.loads(self.text)]
        return [json.loads(line[5:].strip()) for line in self.text.splitlines() if line.startswith("data:")]


class SseStream:
    """The messages of one SSE response as they arrive; `close()` abandons the stream."""

    def __init__(self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse, request_id: int) -> None:
        self.conn = conn
        self.response = response
        self.request_id = request_id
        self.status_code = response.status

    def next(self, timeout: float = 15.0) -> dict[str, Any] | None:
        """The next JSON-RPC message, or None once the stream has ended.

        Raises:
            TimeoutError: nothing arrived within `timeout` seconds.
        """
        sock = self.conn.sock
        if sock is not None:
            sock.settimeout(timeout)
        data: list[str] = []
        while True:
            line = self.response.readline()
            if not line:
                return None
            text = line.decode().rstrip("\r\n")
            if text.startswith("data:"):
                data.append(text[5:].strip())
            elif not text and data:
                return dict(json.loads("\n".join(data)))

    def close(self) -> None:
        self.response.close()
        self.conn.close()


class RawHttpClient:
    """Raw JSON-RPC over Streamable HTTP, one request per POST, on one keep-alive connection."""

    def __init__(self, url: str, *, timeout: float = 30, client_name: str = "mcp-celery") -> None:
        self.url = url
        parts = urlsplit(url)
        self._host, self._port, self._path = parts.hostname or "127.0.0.1", parts.port or 80, parts.path or "/"
        self._timeout = timeout
        self._client_name = client_name
        self._conn: http.client.HTTPConnection | None = None
        self._id = 0
        #: Headers sent with every request (e.g. Authorization).
        self.extra_headers: dict[str, str] = {}

    def post(
        self,
        method: str,
        params: Mapping[str, Any] | None = None,
        *,
        capabilities: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        name: str | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> HttpReply:
        """Send one request. `capabilities` default: the tasks extension only. `name=""` sends no Mcp-Name.

        `meta` adds to the request's `_meta` (e.g. a `progressToken`).
        """
        self._id += 1
        caps = client_capabilities() if capabilities is None else capabilities
        body = request_body(self._id, method, params, caps, self._client_name, meta)
        route = name if name is not None else (params or {}).get("taskId") or (params or {}).get("name")
        hdrs = {**request_headers(method, str(route) if route else None), **self.extra_headers, **(headers or {})}
        return self.send_raw(json.dumps(body).encode(), hdrs)

    def send_raw(self, body: bytes, headers: Mapping[str, str]) -> HttpReply:
        """POST `body` as it is (for malformed or hand-built requests)."""
        for attempt in (1, 2):
            conn = self._connection()
            try:
                conn.request("POST", self._path, body=body, headers=dict(headers))
                response = conn.getresponse()
                text = response.read().decode(errors="replace")
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # A kept-alive connection the server closed meanwhile: reconnect once.
                self.close()
                if attempt == 2:
                    raise
                continue
            reply_headers = {k.lower(): v for k, v in response.getheaders()}
            if reply_headers.get("connection", "").lower() == "close":
                self.close()
            return HttpReply(response.status, reply_headers, text)
        raise AssertionError("unreachable")

    def stream(
        self, method: str, params: Mapping[str, Any] | None = None, *, capabilities: Mapping[str, Any] | None = None
    ) -> SseStream:
        """Send one request whose reply is an SSE stream (`subscriptions/listen`) on a connection of its own."""
        self._id += 1
        caps = client_capabilities() if capabilities is None else capabilities
        body = json.dumps(request_body(self._id, method, params, caps, self._client_name)).encode()
        conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        conn.request("POST", self._path, body=body, headers={**request_headers(method), **self.extra_headers})
        return SseStream(conn, conn.getresponse(), self._id)

    def call(self, method: str, params: Mapping[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        """The whole JSON-RPC reply (`result` or `error`)."""
        return dict(self.post(method, params, **kw).json())

    def result(self, method: str, params: Mapping[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        """The `result` member of the reply; AssertionError when the reply is an error."""
        reply = self.call(method, params, **kw)
        assert "result" in reply, reply
        return dict(reply["result"])

    def start(self, tool: str, arguments: Mapping[str, Any] | None = None, **capabilities: Any) -> str:
        """Call `tool` as a task (declaring the extension plus `capabilities`) and return its id."""
        result = self.result(
            "tools/call",
            {"name": tool, "arguments": dict(arguments or {})},
            capabilities=client_capabilities(**capabilities),
        )
        assert result["resultType"] == "task", result
        return str(result["taskId"])

    def get(self, task_id: str, **kw: Any) -> dict[str, Any]:
        return self.result("tasks/get", {"taskId": task_id}, **kw)

    def wait(
        self, task_id: str, statuses: Iterable[str] = TERMINAL_STATUSES, timeout: float = 15.0, interval: float = 0.05
    ) -> dict[str, Any]:
        """Poll `tasks/get` until the task is in one of `statuses`.

        Raises:
            AssertionError: `timeout` seconds passed first.
        """
        wanted = set(statuses)
        deadline = time.monotonic() + timeout
        while True:
            task = self.get(task_id)
            if task["status"] in wanted:
                return task
            if time.monotonic() > deadline:
                raise AssertionError(f"task {task_id} not in {sorted(wanted)} after {timeout} s: {task}")
            time.sleep(interval)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        return self._conn


class RawStdioClient:
    """Raw JSON-RPC over a stdio server's stdin/stdout (newline-delimited), e.g. `mcp-celery serve`."""

    def __init__(
        self, args: Sequence[str], env: Mapping[str, str] | None, log: Path, *, cwd: Path | None = None
    ) -> None:
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            list(args), cwd=cwd, env=None if env is None else dict(env),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, start_new_session=True,
        )  # fmt: skip
        self._id = 0
        #: Messages read while waiting for another reply: notifications and replies not yet claimed.
        self.inbox: list[dict[str, Any]] = []

    def send(self, message: Mapping[str, Any]) -> None:
        self.send_raw(json.dumps(message))

    def send_raw(self, line: str) -> None:
        """Write one line as it is (for malformed or hand-built messages)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write((line + "\n").encode())
        self.proc.stdin.flush()

    def request(
        self,
        method: str,
        params: Mapping[str, Any] | None = None,
        *,
        modern: bool = True,
        capabilities: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Send one request and return the whole reply; `modern=False` sends no 2026-07-28 envelope."""
        return self.reply(self.send_request(method, params, modern=modern, capabilities=capabilities))

    def send_request(
        self,
        method: str,
        params: Mapping[str, Any] | None = None,
        *,
        modern: bool = True,
        capabilities: Mapping[str, Any] | None = None,
    ) -> int:
        """Send one request without waiting for its reply; returns its id."""
        self._id += 1
        if modern:
            caps = client_capabilities() if capabilities is None else capabilities
            self.send(request_body(self._id, method, params, caps))
        else:
            self.send({"jsonrpc": "2.0", "id": self._id, "method": method, "params": dict(params or {})})
        return self._id

    def reply(self, request_id: int) -> dict[str, Any]:
        """Read until the reply to `request_id` (kept messages for others go to the inbox)."""
        for index, message in enumerate(self.inbox):
            if message.get("id") == request_id and "method" not in message:
                return self.inbox.pop(index)
        while True:
            message = self.read_message()
            if message.get("id") == request_id and "method" not in message:
                return message
            self.inbox.append(message)

    def read_message(self) -> dict[str, Any]:
        """The next message the server writes (blocking)."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, "the stdio server closed its output"
        return dict(json.loads(line))

    def close(self) -> None:
        stop_group(self.proc)
        self._log.close()
