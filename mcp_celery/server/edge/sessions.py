"""Signed-in sessions kept in Redis: revocable, never longer than the credential that opened them.

Server tier, edge floor (who calls). A browser that signed in (the approval page) holds a random
session id in a cookie; Redis holds the session under a digest of that id (so a reader of Redis
learns no id to present), expiring with it. The session names its principal and the credential that
opened it by kind and reference, never a bearer credential itself (`Credential`: a static token by
its file digest, a JWT by its subject and `exp`). The one exception is an OpenID Connect session,
whose reference is its ID token: an identity assertion for this client that grants no access
anywhere, kept so that sign-out can name it to the provider (`id_token_hint`, which Okta requires),
and gone with the session. Every use checks again, through the check registered
for that kind, that the credential still holds: a token removed from the tokens file (`mcp-celery
token revoke`, or an edit) ends its sessions at their next request, and a session never outlives
the credential's own expiry. Signing out deletes the session here, not only the browser's cookie.

The store knows nothing of bearer tokens: a sign-in of another kind (an OpenID Connect ID token,
say) opens sessions with its own kind, reference and expiry, and registers its own check.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from mcp_celery import logs
from mcp_celery.store.aio import AsyncStore

__all__ = ["Credential", "CredentialCheck", "Session", "SessionStore"]

logger = logging.getLogger(__name__)

#: What a session id looks like (`secrets.token_urlsafe(32)`); anything else is not looked up.
_SESSION_ID = re.compile(r"[A-Za-z0-9_-]{43}")


@dataclass(frozen=True)
class Credential:
    """What opened a session, so that each use can ask whether it still holds; never the secret itself.

    `kind` names the check that re-checks it (`"token"`: a line of the tokens file; `"jwt"`);
    `reference` is what that check looks for (a token's digest as the file holds it); `expires_at`
    (Unix seconds) is the credential's own end, which caps the session.
    """

    kind: str
    reference: str = ""
    expires_at: int | None = None


#: Whether `principal`'s credential still holds: `check(principal, credential)`.
CredentialCheck = Callable[[str, Credential], Awaitable[bool]]


@dataclass(frozen=True)
class Session:
    """A signed-in principal, until when, by which credential, and the nonce of their forms' CSRF tokens."""

    principal: str
    credential: Credential
    expires_at: int
    nonce: str


class SessionStore:
    """Opens, finds (re-checking the credential) and ends sessions kept in the store."""

    def __init__(self, store: AsyncStore, checks: Mapping[str, CredentialCheck], lifetime_s: int) -> None:
        self.store = store
        #: The check for each kind of credential; a session of a kind without one is over.
        self.checks = dict(checks)
        self.lifetime_s = lifetime_s

    async def open(self, principal: str, credential: Credential) -> tuple[Session, str] | None:
        """A new session and its id (for the cookie), lasting `lifetime_s` or until the credential's expiry;
        None when that expiry has passed already."""
        now = int(time.time())
        expires_at = now + self.lifetime_s
        if credential.expires_at is not None:
            expires_at = min(expires_at, credential.expires_at)
        if expires_at <= now:
            return None
        session = Session(principal, credential, expires_at, secrets.token_urlsafe(16))
        session_id = secrets.token_urlsafe(32)
        await self.store.put_session(_digest(session_id), _encode(session), expires_at - now)
        return session, session_id

    async def find(self, session_id: str | None) -> Session | None:
        """The session `session_id` stands for, if it is open and its credential still holds; else None
        (a session whose credential no longer holds is ended)."""
        if not session_id or not _SESSION_ID.fullmatch(session_id):
            return None
        raw = await self.store.session(_digest(session_id))
        session = None if raw is None else _decode(raw)
        if session is None or session.expires_at <= time.time():
            return None
        check = self.checks.get(session.credential.kind)
        if check is not None and await check(session.principal, session.credential):
            return session
        logger.info(
            "session ended: its %s credential no longer holds",
            session.credential.kind,
            extra={"principal": logs.principal_digest(session.principal)},
        )
        await self.end(session_id)
        return None

    async def end(self, session_id: str | None) -> None:
        """End the session (signing out): its id opens nothing any more, whoever holds it."""
        if session_id and _SESSION_ID.fullmatch(session_id):
            await self.store.end_session(_digest(session_id))


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


def _encode(session: Session) -> str:
    credential = session.credential
    return json.dumps(
        {
            "principal": session.principal,
            "expires": session.expires_at,
            "nonce": session.nonce,
            "kind": credential.kind,
            "reference": credential.reference,
            "credentialExpires": credential.expires_at,
        }
    )


def _decode(raw: str) -> Session | None:
    try:
        fields = json.loads(raw)
        credential = Credential(str(fields["kind"]), str(fields["reference"]), fields["credentialExpires"])
        return Session(str(fields["principal"]), credential, int(fields["expires"]), str(fields["nonce"]))
    except (ValueError, KeyError, TypeError):
        return None
