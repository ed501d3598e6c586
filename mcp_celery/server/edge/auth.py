"""Who is calling: bearer-token verifiers for Streamable HTTP, and the principal that owns a task.

Two ways to authenticate, usable together (a name is one principal whichever way it arrives):

- static tokens (`MCP_CELERY_AUTH_TOKENS=PATH`): the file holds one `PRINCIPAL sha256:HEXDIGEST`
  line per token, never a token itself; `mcp-celery token new PRINCIPAL` makes one;
- signed JWTs (`MCP_CELERY_JWT_JWKS`, `_ISSUER`, `_AUDIENCE`, `_PRINCIPAL_CLAIM`), verified with joserfc.

Both plug into the SDK's `TokenVerifier` hook, so the SDK answers 401 with `WWW-Authenticate`
and publishes the RFC 9728 protected resource metadata; handlers read the verified token with
`get_access_token()`. Each also names what it accepted as a `Credential` (kind, reference, expiry)
and re-checks one (`Verifiers.checks`), so that a session opened with it (`edge.sessions`) ends
when the token leaves the file or the JWT expires.
"""

from __future__ import annotations

import getpass
import hmac
import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import anyio
import httpx
from joserfc import jws, jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken, TokenVerifier
from mcp.server.auth.settings import AuthSettings
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mcp_celery.errors import ConfigurationError
from mcp_celery.server.edge.sessions import Credential, CredentialCheck
from mcp_celery.server.edge.tokens import hash_token, parse_token_file
from mcp_celery.server.ops import metrics
from mcp_celery.settings import Settings

__all__ = [
    "CountedRefusals",
    "JwtVerifier",
    "StaticTokenVerifier",
    "Verifiers",
    "auth_settings",
    "build_verifier",
    "request_principal",
]

logger = logging.getLogger(__name__)

#: Signature algorithms accepted in JWTs: asymmetric only (a JWKS holds public keys; no "none", no HMAC).
JWT_ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]
#: A JWKS URL is fetched again for an unknown `kid` at most this often, so forged kids cannot flood the issuer.
JWKS_REFETCH_S = 30.0


def request_principal(*, over_http: bool) -> str:
    """Who owns tasks created by the current request.

    Over HTTP: the principal of the verified bearer token, or "" (anonymous) when no
    authentication is configured. Over stdio: the local user running the server, the
    only one who can reach its stdin.
    """
    token = get_access_token()
    if token is not None:
        return token.client_id
    return "" if over_http else _local_user()


def _local_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (some containers): the uid still tells users apart
        return f"uid:{os.getuid()}"


# ---------------------------------------------------------------- static tokens


class StaticTokenVerifier:
    """Bearer tokens whose SHA-256 digests are listed in a file; the file is re-read when it changes."""

    #: The kind of the credentials it accepts (`Credential.kind`).
    kind = "token"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._entries: list[tuple[str, bytes]] = []
        self._reload()

    def _reload(self) -> None:
        stat = self.path.stat()
        stamp = (stat.st_ino, stat.st_mtime_ns, stat.st_size)  # the inode too: `token revoke` replaces the file
        if stamp != self._stamp:
            self._entries = parse_token_file(self.path.read_text())
            self._stamp = stamp

    def _reloaded(self) -> bool:
        """Whether the file, as it is now, could be read (else every token is refused, and it is logged)."""
        try:
            self._reload()
        except (OSError, ConfigurationError):  # unreadable, or a line half written: refuse, never guess
            logger.exception("cannot read the token file %s; refusing every token", self.path)
            return False
        return True

    async def verify_token(self, token: str) -> AccessToken | None:
        if not self._reloaded():
            return None
        digest = hash_token(token).encode()
        found: str | None = None
        # Every line is compared, in constant time, so timing says nothing about which digest matched.
        for principal, expected in self._entries:
            if hmac.compare_digest(digest, expected) and found is None:
                found = principal
        if found is None:
            return None
        return AccessToken(token=token, client_id=found, scopes=[], subject=found)

    def credential(self, found: AccessToken) -> Credential:
        """The accepted token as a session remembers it: by the digest its line of the file holds."""
        return Credential(self.kind, hash_token(found.token))

    async def still_valid(self, principal: str, credential: Credential) -> bool:
        """Whether the file (as it is now) still has the line `PRINCIPAL DIGEST` of that credential."""
        if not self._reloaded():
            return False
        digest = credential.reference.encode()
        return any(name == principal and hmac.compare_digest(digest, line) for name, line in self._entries)


# ---------------------------------------------------------------- JWT


class JwtVerifier:
    """Signed JWTs: signature against the issuer's JWKS, then exp, nbf, iss and aud."""

    #: The kind of the credentials it accepts (`Credential.kind`).
    kind = "jwt"

    def __init__(
        self,
        jwks: str,
        *,
        issuer: str,
        audience: str,
        principal_claim: str = "sub",
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.source = jwks
        self.remote = jwks.startswith("https://")
        if not self.remote and "://" in jwks and not jwks.startswith("file://"):
            raise ConfigurationError(f"MCP_CELERY_JWT_JWKS must be an https:// URL or a local file, not {jwks!r}")
        self.principal_claim = principal_claim
        self.claims = jwt.JWTClaimsRegistry(
            leeway=30,
            iss={"essential": True, "value": issuer},
            aud={"essential": True, "value": audience},
            exp={"essential": True},
        )
        self.audience = audience
        self._http = http
        self._keys: KeySet | None = None
        self._fetched_at = float("-inf")
        self._lock = anyio.Lock()
        if not self.remote:
            self._keys = self._read_file()  # fail at startup, not at the first request

    def _read_file(self) -> KeySet:
        path = Path(self.source.removeprefix("file://"))
        try:
            return KeySet.import_key_set(json.loads(path.read_text()))
        except (OSError, ValueError, JoseError) as exc:
            raise ConfigurationError(f"cannot load the JWKS file {path}: {exc}") from exc

    async def _fetch(self) -> KeySet:
        client = self._http or httpx.AsyncClient(timeout=10)
        try:
            response = await client.get(self.source)
            response.raise_for_status()
            return KeySet.import_key_set(response.json())
        finally:
            if self._http is None:
                await client.aclose()

    async def _key_set(self, kid: str | None) -> KeySet | None:
        """The cached keys; fetched again when they lack `kid` (a rotation), at most every JWKS_REFETCH_S."""
        keys = self._keys
        if keys is not None and (kid is None or _has_kid(keys, kid)):
            return keys
        async with self._lock:
            keys = self._keys  # another request may have fetched while this one waited for the lock
            if keys is not None and (kid is None or _has_kid(keys, kid)):
                return keys
            if time.monotonic() - self._fetched_at < JWKS_REFETCH_S:
                return keys
            self._fetched_at = time.monotonic()
            try:
                self._keys = await self._fetch() if self.remote else self._read_file()
            except (httpx.HTTPError, ValueError, JoseError, ConfigurationError):
                logger.exception("cannot load the JWKS from %s", self.source)
            return self._keys

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            header = jws.extract_compact(token.encode()).headers()
            kid = header.get("kid")
            keys = await self._key_set(kid if isinstance(kid, str) else None)
            if keys is None:
                return None
            decoded = jwt.decode(token, _pick(keys, kid), algorithms=JWT_ALGORITHMS)
            self.claims.validate(decoded.claims)
        except (JoseError, ValueError, TypeError) as exc:
            logger.info("JWT refused: %s", exc)
            return None
        return self._access_token(token, decoded.claims)

    def _access_token(self, token: str, claims: dict[str, Any]) -> AccessToken | None:
        principal = claims.get(self.principal_claim)
        if not isinstance(principal, str) or not principal:
            logger.info("JWT refused: claim %r is not a non-empty string", self.principal_claim)
            return None
        scope = claims.get("scope")
        exp = claims.get("exp")
        return AccessToken(
            token=token,
            client_id=principal,
            scopes=scope.split() if isinstance(scope, str) else [],
            expires_at=int(exp) if isinstance(exp, int | float) else None,
            resource=self.audience,
            subject=claims.get("sub") if isinstance(claims.get("sub"), str) else None,
            claims={"iss": claims.get("iss")},
        )

    def credential(self, found: AccessToken) -> Credential:
        """The accepted JWT as a session remembers it: its subject, and its `exp`, which ends the session."""
        return Credential(self.kind, found.subject or found.client_id, found.expires_at)

    async def still_valid(self, principal: str, credential: Credential) -> bool:
        """Whether the JWT is not past its `exp` (no leeway: a session ends when its token does)."""
        return credential.expires_at is None or time.time() < credential.expires_at


def _has_kid(keys: KeySet, kid: str) -> bool:
    return any(key.kid == kid for key in keys.keys)


def _pick(keys: KeySet, kid: object) -> Any:
    # A token without `kid` is accepted only when the set has a single key: no guessing among several.
    return keys.keys[0] if kid is None and len(keys.keys) == 1 else keys


class CredentialVerifier(TokenVerifier, Protocol):
    """A verifier that also names what it accepted and re-checks it (`StaticTokenVerifier`, `JwtVerifier`)."""

    kind: str

    def credential(self, found: AccessToken) -> Credential: ...

    async def still_valid(self, principal: str, credential: Credential) -> bool: ...


class Verifiers:
    """The configured verifiers: a token any of them accepts is accepted (static tokens first: no I/O)."""

    def __init__(self, verifiers: Sequence[CredentialVerifier]) -> None:
        self.verifiers = list(verifiers)

    async def verify_token(self, token: str) -> AccessToken | None:
        found = await self.identify(token)
        return None if found is None else found[0]

    async def identify(self, token: str) -> tuple[AccessToken, Credential] | None:
        """The accepted token and the credential a session opened with it remembers, or None."""
        for verifier in self.verifiers:
            found = await verifier.verify_token(token)
            if found is not None:
                return found, verifier.credential(found)
        return None

    def checks(self) -> dict[str, CredentialCheck]:
        """How each kind of credential is re-checked (`edge.sessions.SessionStore`)."""
        return {verifier.kind: verifier.still_valid for verifier in self.verifiers}


# ---------------------------------------------------------------- counting refusals


class CountedRefusals:
    """ASGI middleware around the authenticated MCP app: counts each HTTP 401 in `auth_failures{reason}`.

    Counted at the response, not in the verifiers: the SDK refuses a request without a bearer token
    (`missing`) before any verifier runs, and refuses an expired or foreign token (`rejected`) after.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not metrics.enabled():
            await self.app(scope, receive, send)
            return

        async def counting(message: Message) -> None:
            if message["type"] == "http.response.start" and message.get("status") == 401:
                metrics.record_auth_failure("rejected" if _bearer_sent(scope) else "missing")
            await send(message)

        await self.app(scope, receive, counting)


def _bearer_sent(scope: Scope) -> bool:
    return any(
        name.lower() == b"authorization" and value[:7].lower() == b"bearer " for name, value in scope.get("headers", ())
    )


# ---------------------------------------------------------------- wiring


def public_url(settings: Settings, host: str, port: int) -> str:
    if settings.public_url:
        return settings.public_url
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/mcp"


def build_verifier(settings: Settings, resource_url: str) -> Verifiers | None:
    """The configured verifier, or None when neither static tokens nor JWT are configured.

    Raises:
        ConfigurationError: a token file or JWKS that cannot be read, or JWT settings without an issuer.
    """
    verifiers: list[CredentialVerifier] = []
    if settings.auth_tokens:
        path = Path(settings.auth_tokens)
        try:
            verifiers.append(StaticTokenVerifier(path))
        except OSError as exc:
            raise ConfigurationError(f"cannot read MCP_CELERY_AUTH_TOKENS file {path}: {exc.strerror}") from exc
    if settings.jwt_jwks:
        if not settings.jwt_issuer:
            raise ConfigurationError("MCP_CELERY_JWT_JWKS is set but MCP_CELERY_JWT_ISSUER is not")
        verifiers.append(
            JwtVerifier(
                settings.jwt_jwks,
                issuer=settings.jwt_issuer,
                audience=settings.jwt_audience or resource_url,
                principal_claim=settings.jwt_principal_claim,
            )
        )
    return Verifiers(verifiers) if verifiers else None


def auth_settings(settings: Settings, resource_url: str) -> AuthSettings:
    """What the SDK needs to answer 401 with `WWW-Authenticate` and serve RFC 9728 metadata.

    With static tokens only there is no authorization server; the metadata then names the
    server's own origin, where no OAuth endpoints exist (tokens come from `mcp-celery token new`).
    """
    issuer = settings.jwt_issuer if settings.jwt_jwks and settings.jwt_issuer else _origin(resource_url)
    # The audience is checked by JwtVerifier itself; static tokens carry no resource indicator.
    return AuthSettings(issuer_url=issuer, resource_server_url=resource_url, validate_token_resource=False)  # type: ignore[arg-type]


def _origin(url: str) -> str:
    parsed = httpx.URL(url)
    return str(parsed.copy_with(path="/", query=None, fragment=None)).rstrip("/")


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def check_exposure(settings: Settings, host: str, *, allow_unauthenticated: bool) -> None:
    """Refuse to serve other machines without authentication, unless told to.

    Raises:
        ConfigurationError: a non-loopback host with neither static tokens nor JWT configured.
    """
    if host in LOOPBACK or allow_unauthenticated or settings.auth_tokens or settings.jwt_jwks:
        return
    raise ConfigurationError(
        f"refusing to serve {host} without authentication: anyone who reaches the port could read and cancel "
        "every task; set MCP_CELERY_AUTH_TOKENS or MCP_CELERY_JWT_JWKS, or pass --allow-unauthenticated"
    )


def http_app_options(settings: Settings, host: str, port: int) -> dict[str, Any]:
    """Keyword arguments for `Server.streamable_http_app`: authentication, body limit."""
    resource_url = public_url(settings, host, port)
    verifier = build_verifier(settings, resource_url)
    if host not in LOOPBACK and not settings.allowed_hosts:
        logger.warning(
            "serving %s, but only requests addressed to localhost pass the Host check (421 otherwise); "
            "set MCP_CELERY_ALLOWED_HOSTS to the name clients use",
            host,
        )
    options: dict[str, Any] = {
        "host": host,
        # Host and Origin are checked in front of the whole HTTP app (`edge.hosts.HostCheck`), not only /mcp.
        "transport_security": TransportSecuritySettings(enable_dns_rebinding_protection=False),
        "max_request_body_size": settings.max_request_bytes,
    }
    if verifier is not None:
        options["token_verifier"] = verifier
        options["auth"] = auth_settings(settings, resource_url)
    return options
