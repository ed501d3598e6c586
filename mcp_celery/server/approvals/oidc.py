"""OpenID Connect sign-in for the approval page: the provider, the authorization request, the ID token.

Server tier, the approval page's own. authlib's Starlette client speaks the protocol: the
authorization code flow with PKCE (S256), `state` and `nonce`, the code exchange with the client's
authentication, and the ID token's checks (signature by a key of the issuer's JWKS, `iss`, `aud`,
`exp`, `iat`, `nonce`, `azp`, `at_hash`). This module configures it from `Settings`, finds the
provider (discovery, checked: the document must name the configured issuer, its endpoints must be
https), and refuses what authlib would let through: signature algorithms outside `JWT_ALGORITHMS`
(no `none`, no HMAC), a principal claim that is not a non-empty string, an `email` principal the
provider says is unverified. What authlib keeps between the trip out and back in a cookie session,
the page keeps in Redis (`oidc_routes`: one record per attempt, taken once).

The provider may be down when the server starts: that is a warning, the page says sign-in is
unavailable, and discovery is tried again when someone signs in (at most every DISCOVERY_RETRY_S).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import anyio
import httpx
import httpx2
from authlib.integrations.starlette_client import OAuthError, StarletteIntegration, StarletteOAuth2App
from joserfc import jws
from joserfc.errors import JoseError

from mcp_celery import logs
from mcp_celery.core.approvals import page_url
from mcp_celery.errors import ConfigurationError, McpCeleryError
from mcp_celery.server.edge.auth import JWT_ALGORITHMS, LOOPBACK
from mcp_celery.server.edge.sessions import Credential
from mcp_celery.settings import Settings

__all__ = ["Attempt", "Identity", "OidcClient", "OidcConfig", "SignInRefused", "oidc_client", "oidc_config"]

logger = logging.getLogger(__name__)

#: How long a person may take at the provider (password, second factor) before the attempt expires.
ATTEMPT_S = 600
#: After a failed discovery, the next sign-in tries again, but not more often than this.
DISCOVERY_RETRY_S = 30.0
#: Clock skew allowed on the ID token's exp and iat, as for JWT bearer tokens.
LEEWAY_S = 30
#: The page's own path for the provider's redirect back (`oidc_routes`).
CALLBACK = "oidc/callback"
# authlib logs the PKCE code verifier at DEBUG: a secret of the attempt, kept out of every log.
logging.getLogger("authlib.integrations.base_client.sync_app").setLevel(logging.INFO)


class SignInRefused(McpCeleryError):
    """An OpenID Connect sign-in the page refuses: `status` for the response, `shown` for the person.

    The exception's message is the log line's reason (never a token or the principal's name).
    """

    def __init__(self, status: int, reason: str, shown: str) -> None:
        super().__init__(reason)
        self.status = status
        self.shown = shown


@dataclass(frozen=True)
class OidcConfig:
    """The approval page's client at one provider, from `Settings` (`oidc_config`)."""

    issuer: str
    client_id: str
    client_secret: str | None = field(repr=False)
    scopes: str
    principal_claim: str
    redirect_uri: str
    signed_out_uri: str
    provider_name: str


def oidc_config(settings: Settings, public_url: str) -> OidcConfig | None:
    """The OpenID Connect client the settings describe, or None when MCP_CELERY_OIDC_ISSUER is unset.

    The redirect URI is the page's, beside the MCP endpoint: `https://host/mcp` gives
    `https://host/approvals/oidc/callback` (register that at the provider).

    Raises:
        ConfigurationError: no client id, scopes without `openid`, an issuer that is neither https nor
            loopback, or a secret file that cannot be read or is empty (its content is never shown).
    """
    issuer = (settings.oidc_issuer or "").rstrip("/")
    if not issuer:
        return None
    if not settings.oidc_client_id:
        raise ConfigurationError("MCP_CELERY_OIDC_ISSUER is set but MCP_CELERY_OIDC_CLIENT_ID is not")
    if "openid" not in settings.oidc_scopes.split():
        raise ConfigurationError(f"MCP_CELERY_OIDC_SCOPES must include openid, not {settings.oidc_scopes!r}")
    _require_secure("MCP_CELERY_OIDC_ISSUER", issuer)
    return OidcConfig(
        issuer=issuer,
        client_id=settings.oidc_client_id,
        client_secret=_read_secret(settings.oidc_client_secret_file),
        scopes=settings.oidc_scopes,
        principal_claim=settings.jwt_principal_claim,
        redirect_uri=page_url(public_url, CALLBACK),
        signed_out_uri=page_url(public_url, "").rstrip("/"),
        provider_name=settings.oidc_provider_name or urlsplit(issuer).hostname or issuer,
    )


def oidc_client(settings: Settings, public_url: str) -> OidcClient | None:
    """The approval page's OpenID Connect client, its provider looked up now (a warning if it does not
    answer), or None when MCP_CELERY_OIDC_ISSUER is unset.

    Raises:
        ConfigurationError: the settings are incomplete (`oidc_config`).
    """
    config = oidc_config(settings, public_url)
    if config is None:
        return None
    client = OidcClient(config)
    client.discover_at_start()
    return client


def _read_secret(path: str | None) -> str | None:
    if not path:
        return None
    try:
        secret = Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigurationError(f"cannot read MCP_CELERY_OIDC_CLIENT_SECRET_FILE {path}: {exc.strerror}") from exc
    if not secret:
        raise ConfigurationError(f"MCP_CELERY_OIDC_CLIENT_SECRET_FILE {path} is empty")
    return secret


def _require_secure(name: str, url: str) -> None:
    """https, or http on a loopback host (a provider on this machine: development and tests)."""
    parts = urlsplit(url)
    if parts.scheme == "https" or (parts.scheme == "http" and parts.hostname in LOOPBACK):
        return
    raise ConfigurationError(f"{name} must be an https:// URL (http:// on a loopback host only), not {url!r}")


@dataclass(frozen=True)
class Attempt:
    """What the page keeps while a person is at the provider: the secrets to finish with, and where to go."""

    nonce: str
    code_verifier: str
    next_path: str
    binding: str  # digest of the browser's attempt cookie: the same browser must come back

    def encode(self) -> bytes:
        return json.dumps([self.nonce, self.code_verifier, self.next_path, self.binding]).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Attempt:
        nonce, verifier, next_path, binding = json.loads(raw)
        return cls(str(nonce), str(verifier), str(next_path), str(binding))


@dataclass(frozen=True)
class Identity:
    """Who the provider signed in, and until when its ID token holds."""

    principal: str
    expires_at: int
    id_token: str = field(repr=False)


class OidcClient:
    """The page's client at the provider of `config`: discovery, the authorization URL, the ID token."""

    def __init__(self, config: OidcConfig, *, timeout_s: float = 10.0) -> None:
        self.config = config
        self.timeout_s = timeout_s
        self._app: StarletteOAuth2App | None = None
        self._tried_at = float("-inf")
        self._lock = anyio.Lock()

    @property
    def discovery_url(self) -> str:
        return f"{self.config.issuer}/.well-known/openid-configuration"

    def discover_at_start(self) -> bool:
        """Find the provider now (a blocking request, at start); a warning, not an error, when it cannot."""
        self._tried_at = time.monotonic()
        try:
            response = httpx.get(self.discovery_url, timeout=self.timeout_s)
            self._app = self._client(self._checked(response))
        except (httpx.HTTPError, ValueError, ConfigurationError) as exc:
            self._unavailable(exc)
            return False
        logs.announce(f"the approval page signs people in with {self.config.provider_name} ({self.config.issuer})")
        return True

    async def available(self) -> bool:
        """Whether the provider was found; if not, discovery is tried again (at most every DISCOVERY_RETRY_S)."""
        if self._app is not None:
            return True
        async with self._lock:
            if self._app is None and time.monotonic() - self._tried_at >= DISCOVERY_RETRY_S:
                self._tried_at = time.monotonic()
                try:
                    async with httpx.AsyncClient(timeout=self.timeout_s) as http:
                        self._app = self._client(self._checked(await http.get(self.discovery_url)))
                    logger.info("approval page: %s answers again; sign-in is available", self.config.issuer)
                except (httpx.HTTPError, ValueError, ConfigurationError) as exc:
                    self._unavailable(exc)
        return self._app is not None

    def _unavailable(self, exc: Exception) -> None:
        logger.warning(
            "approval page: cannot use the OpenID Connect provider %s (%s); the page says sign-in is "
            "unavailable and tries again at the next sign-in",
            self.config.issuer,
            exc or type(exc).__name__,
        )

    def _checked(self, response: httpx.Response) -> dict[str, Any]:
        """The discovery document, if it is one for the configured issuer (OpenID Connect Discovery §4.3)."""
        response.raise_for_status()
        metadata = response.json()
        if not isinstance(metadata, dict) or str(metadata.get("issuer", "")).rstrip("/") != self.config.issuer:
            found = metadata.get("issuer") if isinstance(metadata, dict) else None
            raise ConfigurationError(f"the discovery document names issuer {found!r}, not the configured one")
        for name in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
            if not isinstance(metadata.get(name), str):
                raise ConfigurationError(f"the discovery document has no {name}")
            _require_secure(name, metadata[name])
        offered = metadata.get("id_token_signing_alg_values_supported") or ["RS256"]
        # authlib accepts whatever the document lists; asymmetric algorithms only, as for JWT bearer tokens.
        metadata["id_token_signing_alg_values_supported"] = [a for a in offered if a in JWT_ALGORITHMS] or ["RS256"]
        metadata.pop("jwks", None)  # keys come from jwks_uri only
        return metadata

    def _client(self, metadata: dict[str, Any]) -> StarletteOAuth2App:
        config = self.config
        client_kwargs = {
            "scope": config.scopes,
            "code_challenge_method": "S256",
            "timeout": self.timeout_s,
            # With no secret the page is a public client: PKCE alone binds the code to this attempt.
            "token_endpoint_auth_method": "client_secret_basic" if config.client_secret else "none",
        }
        app = StarletteOAuth2App(
            StarletteIntegration("oidc"),
            name="oidc",
            client_id=config.client_id,
            client_secret=config.client_secret,
            client_kwargs=client_kwargs,
        )
        app.server_metadata = metadata  # found above; authlib reads its endpoints and caches the JWKS here
        return app

    async def authorization(self) -> tuple[str, str, str, str]:
        """A new authorization request: (the provider's URL to send the person to, state, nonce, code verifier).

        Raises:
            SignInRefused: 503, the provider has not been found.
        """
        if not await self.available() or self._app is None:
            raise SignInRefused(503, "provider unavailable", self.unavailable_text)
        made = await self._app.create_authorization_url(self.config.redirect_uri)
        return str(made["url"]), str(made["state"]), str(made["nonce"]), str(made["code_verifier"])

    @property
    def unavailable_text(self) -> str:
        return f"Sign-in with {self.config.provider_name} is unavailable right now: the provider does not answer."

    async def identity(self, code: str, attempt: Attempt) -> Identity:
        """Exchange `code` (with the attempt's PKCE verifier) and verify the ID token that comes back.

        Raises:
            SignInRefused: 403 for a code or ID token refused, 503 when the provider cannot be reached.
        """
        app = self._app
        if app is None:
            raise SignInRefused(503, "provider unavailable", self.unavailable_text)
        try:
            token = await app.fetch_access_token(
                redirect_uri=self.config.redirect_uri, code=code, code_verifier=attempt.code_verifier
            )
        except OAuthError as exc:
            raise SignInRefused(403, f"token endpoint refused the code: {exc.error}", _REFUSED) from None
        except (httpx2.HTTPError, OSError) as exc:
            raise SignInRefused(503, f"token endpoint unreachable: {exc}", self.unavailable_text) from None
        if not isinstance(token.get("id_token"), str):
            raise SignInRefused(403, "no ID token in the token response", _REFUSED)
        principal, expires_at = self._principal(await self._claims(app, token, attempt))
        return Identity(principal, expires_at, token["id_token"])

    async def _claims(self, app: StarletteOAuth2App, token: dict[str, Any], attempt: Attempt) -> dict[str, Any]:
        options = {
            "iss": {"essential": True, "value": app.server_metadata["issuer"]},
            # authlib alone checks `aud` only through `azp`: a token for another audience must fail here.
            "aud": {"essential": True, "value": self.config.client_id},
            "exp": {"essential": True},
        }
        try:
            claims = await app.parse_id_token(token, nonce=attempt.nonce, claims_options=options, leeway=LEEWAY_S)
        except (JoseError, ValueError, KeyError, TypeError) as exc:
            raise SignInRefused(403, f"ID token refused: {type(exc).__name__}: {exc}", _REFUSED) from None
        except (httpx2.HTTPError, OSError) as exc:
            raise SignInRefused(503, f"JWKS unreachable: {exc}", self.unavailable_text) from None
        return dict(claims)

    def _principal(self, claims: dict[str, Any]) -> tuple[str, int]:
        claim = self.config.principal_claim
        principal = claims.get(claim)
        if not isinstance(principal, str) or not principal:
            raise SignInRefused(403, f"ID token claim {claim!r} is not a non-empty string", _REFUSED)
        if claim == "email" and claims.get("email_verified") is False:
            raise SignInRefused(403, "ID token email not verified by the provider", _REFUSED)
        return principal, int(claims["exp"])

    async def still_holds(self, principal: str, credential: Credential) -> bool:
        """Whether a session this client opened may still be used (`edge.sessions.CredentialCheck`, at each
        request and decision): the ID token kept as its credential (verified when the provider issued it)
        is unexpired, names `principal`, and was issued by the configured issuer to this client, so a
        session outlives neither its ID token nor a change of provider or client. The provider is not
        asked: a person disabled there keeps a session here until the token's `exp`."""
        try:
            claims = json.loads(jws.extract_compact(credential.reference.encode()).payload)
        except (JoseError, ValueError):
            return False
        if not isinstance(claims, dict):
            return False
        audience = claims.get("aud")
        return (
            str(claims.get("iss", "")).rstrip("/") == self.config.issuer
            and self.config.client_id in (audience if isinstance(audience, list) else [audience])
            and claims.get(self.config.principal_claim) == principal
            and isinstance(claims.get("exp"), int | float)
            and claims["exp"] > time.time()
        )

    async def end_session_url(self, id_token: str | None) -> str | None:
        """Where to send a person who signs out so the provider ends its session too (RP-initiated logout),
        or None when the provider offers no `end_session_endpoint`."""
        endpoint = self._app.server_metadata.get("end_session_endpoint") if self._app is not None else None
        if not isinstance(endpoint, str):
            return None
        params = {"client_id": self.config.client_id, "post_logout_redirect_uri": self.config.signed_out_uri}
        if id_token:
            params["id_token_hint"] = id_token
        return f"{endpoint}{'&' if '?' in endpoint else '?'}{urlencode(params)}"


#: What the person reads when the provider's answer is refused (the log line says why).
_REFUSED = "The identity provider's answer was not accepted, so you are not signed in. Please try again."
