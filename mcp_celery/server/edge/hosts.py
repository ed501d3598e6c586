"""Host and Origin checks against DNS rebinding, in front of the whole HTTP app.

Server tier, edge floor. One ASGI middleware checks every request to `/mcp`, `/approvals`,
`/artifacts` and the RFC 9728 metadata alike (the SDK's own check covers its MCP endpoint only, so
it is turned off there and this one stands in front of everything): a `Host` that is not a loopback
name or one of MCP_CELERY_ALLOWED_HOSTS gets 421, an `Origin` of another site gets 403, each with a
body that names the value received and the setting. Only the probes and `/metrics` answer before it
(`mcp_celery.server.ops.operations`): a kubelet and Prometheus address the pod by its IP.
"""

from __future__ import annotations

import logging

from mcp.server.transport_security import TransportSecuritySettings
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from mcp_celery.settings import Settings

__all__ = ["HostCheck", "host_refused", "origin_refused", "transport_security"]

logger = logging.getLogger(__name__)

#: The longest Host or Origin value quoted back in a refusal.
_QUOTED_MAX = 100


def transport_security(settings: Settings) -> TransportSecuritySettings:
    """Host/Origin checking against DNS rebinding: loopback names always, plus MCP_CELERY_ALLOWED_HOSTS."""
    names = [n.strip() for n in (settings.allowed_hosts or "").split(",") if n.strip()]
    if "*" in names:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    hosts = ["127.0.0.1:*", "localhost:*", "[::1]:*"]
    origins = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]
    for name in names:
        hosts.append(name)
        origins += [f"https://{name}", f"http://{name}"]
        if not name.endswith("]") and ":" not in name.rsplit("]", 1)[-1]:  # no port given: any port
            hosts.append(f"{name}:*")
            origins += [f"https://{name}:*", f"http://{name}:*"]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins)


def _matches(value: str, allowed: list[str]) -> bool:
    """`value` is one of `allowed`, or has a port after one that ends in `:*`."""
    return value in allowed or any(
        pattern.endswith(":*") and value.startswith(pattern[:-1]) and value[len(pattern) - 1 :].isdigit()
        for pattern in allowed
    )


class HostCheck:
    """ASGI middleware: 421 for a foreign Host, 403 for a foreign Origin; see the module docstring."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.rules = transport_security(settings)

    def refusal(self, headers: Headers) -> tuple[int, str] | None:
        """The status and text that refuse a request with these headers, or None to let it through."""
        if not self.rules.enable_dns_rebinding_protection:
            return None
        host = headers.get("host")
        if not host or not _matches(host, self.rules.allowed_hosts):
            return 421, host_refused(headers)
        origin = headers.get("origin")
        if origin and not _matches(origin, self.rules.allowed_origins):
            return 403, origin_refused(headers)
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refused = self.refusal(Headers(scope=scope)) if scope["type"] in ("http", "websocket") else None
        if refused is None:
            await self.app(scope, receive, send)
            return
        status, text = refused
        logger.warning("refused a request to %s: %s", scope.get("path", ""), text)
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = text.encode()
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def host_refused(headers: Headers) -> str:
    """The body of the 421 answer to a request addressed to another host."""
    return (
        f"Invalid Host header {_quoted(headers.get('host'))}: allowed are localhost, 127.0.0.1, [::1] and the "
        "names in MCP_CELERY_ALLOWED_HOSTS; set it to the name clients use"
    )


def origin_refused(headers: Headers) -> str:
    """The body of the 403 answer to a request sent from a page of another site."""
    return (
        f"Invalid Origin header {_quoted(headers.get('origin'))}: allowed are the loopback origins and those of "
        "the names in MCP_CELERY_ALLOWED_HOSTS"
    )


def _quoted(value: str | None) -> str:
    if value is None:
        return "(none)"
    return repr(value if len(value) <= _QUOTED_MAX else value[:_QUOTED_MAX] + "...")
