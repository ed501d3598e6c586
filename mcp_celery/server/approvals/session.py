"""The approval page's session: a signed cookie naming the signed-in principal, CSRF tokens, sign-in limits.

Server tier, the approval page's own. Nothing here is kept in memory: the cookie is signed with a key
derived from the deployment's secret in Redis (`AsyncStore.state_secret`), so every server process
and replica accepts it, and it carries the principal's name and an expiry, never a credential. The
cookie is HttpOnly, Secure and SameSite=Strict, under the page's path only. A form's CSRF token is an
HMAC of the session's random nonce (or, before sign-in, of a nonce in a cookie of its own), so a
page of another site can neither read nor forge it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

__all__ = ["COOKIE", "PRE_COOKIE", "Session", "SessionKeys", "cookie_header"]

#: The session cookie, and the one that carries the sign-in form's nonce before there is a session.
COOKIE, PRE_COOKIE = "mcp_celery_approvals", "mcp_celery_approvals_pre"
#: The path the cookies are sent to.
PATH = "/approvals"


@dataclass(frozen=True)
class Session:
    """Who is signed in, until when, and the nonce their forms' CSRF tokens are made from."""

    principal: str
    expires: int
    nonce: str


class SessionKeys:
    """Signs and checks session cookies and CSRF tokens with a key derived from the deployment's secret."""

    def __init__(self, secret: bytes) -> None:
        self._key = hmac.new(secret, b"mcp-celery approval page", hashlib.sha256).digest()

    def _mac(self, *parts: str) -> str:
        text = "\n".join(parts).encode()
        return base64.urlsafe_b64encode(hmac.new(self._key, text, hashlib.sha256).digest()).decode().rstrip("=")

    def new_session(self, principal: str, lifetime_s: int) -> tuple[Session, str]:
        """A new session and its cookie value."""
        session = Session(principal, int(time.time()) + lifetime_s, secrets.token_urlsafe(16))
        body = base64.urlsafe_b64encode(json.dumps([session.principal, session.expires, session.nonce]).encode())
        value = body.decode().rstrip("=")
        return session, f"{value}.{self._mac('session', value)}"

    def session(self, cookie: str | None) -> Session | None:
        """The session a cookie value stands for, or None (absent, forged or expired)."""
        if not cookie or "." not in cookie:
            return None
        value, mac = cookie.rsplit(".", 1)
        if not hmac.compare_digest(mac, self._mac("session", value)):
            return None
        try:
            principal, expires, nonce = json.loads(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)))
        except ValueError:
            return None
        if not isinstance(expires, int) or expires < time.time():
            return None
        return Session(str(principal), expires, str(nonce))

    def csrf(self, nonce: str, form: str) -> str:
        """The CSRF token of form `form` (its action path) for the session or sign-in nonce `nonce`."""
        return self._mac("csrf", nonce, form)

    def csrf_ok(self, nonce: str | None, form: str, token: object) -> bool:
        return bool(nonce) and isinstance(token, str) and hmac.compare_digest(token, self.csrf(str(nonce), form))

    def source(self, address: str) -> str:
        """A digest of a client address, to count its sign-in attempts under (no address is stored)."""
        return self._mac("source", address)[:24]


def cookie_header(name: str, value: str, max_age: int) -> str:
    """A Set-Cookie value: HttpOnly, Secure, SameSite=Strict, the page's path only (max_age 0: delete)."""
    return f"{name}={value}; Max-Age={max_age}; Path={PATH}; HttpOnly; Secure; SameSite=Strict"
