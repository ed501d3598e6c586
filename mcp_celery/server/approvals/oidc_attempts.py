"""OpenID Connect sign-in attempts: what the page keeps while a person is at the provider, and the way back.

Server tier, the approval page's own. `start` sends a person to the provider: the attempt (the
`nonce`, the PKCE code verifier, the page to return to) goes to Redis under a digest of its `state`,
for ATTEMPT_S, and the browser gets a random binding in a cookie of its own. `finish` takes the
attempt once (GETDEL: a replayed `state` finds nothing), checks that the same browser came back with
it (the binding: a login started elsewhere cannot be completed here, RFC 6749 §10.12), shows a
provider's error with its description (escaped by the page; without a valid state, only a plain
error code is shown, so that a crafted link cannot put text of its choosing on the page), and
exchanges the code (`OidcClient.identity`).

The binding cookie is `SameSite=Lax`, the one cookie of the page that is not Strict, on purpose: the
provider's redirect back is a navigation from another site, which carries Lax cookies and never
Strict ones. It holds nothing but a random value, is sent to `/approvals/oidc` only, and lasts as
long as an attempt. State in Redis and not in that cookie, so that any replica finishes any attempt
and an attempt is used once.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping

from mcp_celery.server.approvals.oidc import ATTEMPT_S, Attempt, Identity, OidcClient, SignInRefused
from mcp_celery.store.aio import AsyncStore

__all__ = ["BINDING_COOKIE", "SignInAttempts", "binding_cookie"]

#: The cookie that binds an attempt to the browser that started it.
BINDING_COOKIE = "mcp_celery_oidc"
#: The paths it is sent to: the start and the callback.
BINDING_PATH = "/approvals/oidc"
#: What a binding looks like (`secrets.token_urlsafe(24)`); anything else is replaced, never echoed.
_BINDING = re.compile(r"[A-Za-z0-9_-]{32}")
#: An OAuth error code as providers send them (`access_denied`, `login_required`, ...).
_ERROR_CODE = re.compile(r"[a-z_]{1,64}")
_STATE_MISSING = "The sign-in link is incomplete (no state). Start again from the approval page."
_STATE_UNKNOWN = "This sign-in has expired or was already used. Start again from the approval page."
_OTHER_BROWSER = "This sign-in was started in another browser. Start again from the approval page."


class SignInAttempts:
    """Starts and finishes OpenID Connect sign-ins, keeping each attempt in the store until it is used."""

    def __init__(self, client: OidcClient, store: AsyncStore) -> None:
        self.client = client
        self.store = store

    async def start(self, next_path: str, binding: str | None) -> tuple[str, str]:
        """The provider's URL to send the browser to, and the binding cookie to set (`binding`: the browser's
        current one, kept so that two tabs signing in at once both succeed).

        Raises:
            SignInRefused: 503, the provider cannot be reached.
        """
        binding = binding if binding and _BINDING.fullmatch(binding) else secrets.token_urlsafe(24)
        url, state, nonce, verifier = await self.client.authorization()
        attempt = Attempt(nonce, verifier, next_path, _digest(binding))
        await self.store.keep_sign_in_attempt(_digest(state), attempt.encode(), ATTEMPT_S)
        return url, binding_cookie(binding, ATTEMPT_S)

    async def finish(self, params: Mapping[str, str], binding: str | None) -> tuple[Identity, str]:
        """The identity the provider's answer (the callback's query `params`) proves, and the page to go to.

        Raises:
            SignInRefused: 400 for a missing, unknown, replayed or foreign `state` or a provider's error
                (shown, escaped, with its description); 403 for a code or ID token refused; 503 when the
                provider cannot be reached.
        """
        state = params.get("state")
        if not state:
            code_only = params.get("error", "")
            if _ERROR_CODE.fullmatch(code_only):  # an error without state (RFC 6749 wants it): its code, no more
                shown = f"{self.client.config.provider_name} did not sign you in: {code_only}. Start again."
                raise SignInRefused(400, f"provider answered {code_only} without state", shown)
            raise SignInRefused(400, "callback without state", _STATE_MISSING)
        raw = await self.store.take_sign_in_attempt(_digest(state))
        if raw is None:
            raise SignInRefused(400, "callback with an unknown, expired or replayed state", _STATE_UNKNOWN)
        attempt = Attempt.decode(raw)
        if not binding or not hmac.compare_digest(_digest(binding).encode(), attempt.binding.encode()):
            raise SignInRefused(400, "callback from another browser than the one that started", _OTHER_BROWSER)
        if error := params.get("error"):
            description = params.get("error_description", "")
            shown = f"{self.client.config.provider_name} did not sign you in: {error}"
            raise SignInRefused(
                400, f"provider answered {error[:100]}", f"{shown}: {description}" if description else shown
            )
        code = params.get("code")
        if not code:
            raise SignInRefused(400, "callback without code", _STATE_MISSING)
        return await self.client.identity(code, attempt), attempt.next_path


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def binding_cookie(value: str, max_age: int) -> str:
    """The binding cookie's Set-Cookie value (max_age 0: delete). SameSite=Lax: see the module's docstring."""
    return f"{BINDING_COOKIE}={value}; Max-Age={max_age}; Path={BINDING_PATH}; HttpOnly; Secure; SameSite=Lax"
