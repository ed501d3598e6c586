"""The approval page's cookies and form tokens: the session cookie, CSRF tokens, the sign-in counter's key.

Server tier, the approval page's own. The session itself lives in Redis (`mcp_celery.server.edge.sessions`):
the cookie holds only its random id. It is HttpOnly, Secure and SameSite=Strict, under the page's path
only. A form's CSRF token is an HMAC, with a key derived from the deployment's secret in Redis (so
every server process and replica agrees), of the session's random nonce (or, before sign-in, of a
nonce in a cookie of its own) and the form's path, so a page of another site can neither read nor
forge it. Tokens are compared as bytes, in constant time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

__all__ = ["COOKIE", "PRE_COOKIE", "FormKeys", "cookie_header"]

#: The session cookie, and the one that carries the sign-in form's nonce before there is a session.
COOKIE, PRE_COOKIE = "mcp_celery_approvals", "mcp_celery_approvals_pre"
#: The path the cookies are sent to.
PATH = "/approvals"


class FormKeys:
    """Makes and checks CSRF tokens, and digests client addresses, with a key derived from the deployment's secret."""

    def __init__(self, secret: bytes) -> None:
        self._key = hmac.new(secret, b"mcp-celery approval page", hashlib.sha256).digest()

    def _mac(self, *parts: str) -> str:
        text = "\n".join(parts).encode()
        return base64.urlsafe_b64encode(hmac.new(self._key, text, hashlib.sha256).digest()).decode().rstrip("=")

    def csrf(self, nonce: str, form: str) -> str:
        """The CSRF token of form `form` (its action path) for the session or sign-in nonce `nonce`."""
        return self._mac("csrf", nonce, form)

    def csrf_ok(self, nonce: str | None, form: str, token: object) -> bool:
        """Whether `token` is the CSRF token of `form` for `nonce` (bytes compared: any text is safe here)."""
        if not nonce or not isinstance(token, str):
            return False
        return hmac.compare_digest(token.encode(), self.csrf(nonce, form).encode())

    def source(self, address: str) -> str:
        """A digest of a client address, to count its sign-in attempts under (no address is stored)."""
        return self._mac("source", address)[:24]


def cookie_header(name: str, value: str, max_age: int) -> str:
    """A Set-Cookie value: HttpOnly, Secure, SameSite=Strict, the page's path only (max_age 0: delete)."""
    return f"{name}={value}; Max-Age={max_age}; Path={PATH}; HttpOnly; Secure; SameSite=Strict"
