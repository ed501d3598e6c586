"""A real OpenID Connect provider on loopback for the sign-in tests and `mcp-celery demo --oidc`.

Tier 4 (tooling). The provider is PyPI's `oidc-provider-mock` (a Flask app on authlib's
authorization server: discovery, an authorization endpoint with its own login page where one types
the subject, a token endpoint, JWKS, RP-initiated logout; any client id and secret), run in a
process of its own by `python -m mcp_celery.testing.oidc_provider --port N`. Its issuer is the
address it is reached at: `http://localhost:N`, another site than a page at `http://127.0.0.1:M`.

In front of it, `Checked` adds what the tests must prove and the mock does not do:

- **PKCE, enforced.** An authorization request without an S256 `code_challenge` is refused (400), and
  the token endpoint refuses a code whose `code_verifier` does not hash to its challenge
  (`invalid_grant`); `GET /_test/pkce` counts the exchanges checked and refused.
- **Bad ID tokens, on request.** `POST /_test/tamper` with `{"mode": MODE}` alters the next ID token
  the token endpoint returns: `other-key` (signed by a key outside the JWKS), `audience`, `expired`,
  `nonce` (each signed again with the provider's own key, so that only the claim is wrong),
  `short-lived` (valid for SHORT_LIVED_S more seconds) and `resigned` (nothing wrong: the control).
  Everything else, the JWKS included, is the mock's own.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
from joserfc import jws, jwt
from joserfc.jwk import RSAKey

from mcp_celery.testing.processes import Process, free_port

__all__ = ["SHORT_LIVED_S", "TAMPER_MODES", "Checked", "start_provider"]

#: What `POST /_test/tamper` can do to the next ID token.
TAMPER_MODES = ("other-key", "audience", "expired", "nonce", "resigned", "short-lived")
#: How long a `short-lived` ID token holds.
SHORT_LIVED_S = 5
StartResponse = Callable[..., Any]
Environ = dict[str, Any]


class Checked:
    """WSGI middleware in front of the mock provider: PKCE enforced, ID tokens altered on request."""

    def __init__(self, app: Callable[[Environ, StartResponse], Iterable[bytes]]) -> None:
        self.app = app
        self.challenges: dict[str, str] = {}  # authorization code -> its S256 code_challenge
        self.counts = {"checked": 0, "refused": 0}
        self.tamper: str | None = None
        self.provider_key: RSAKey | None = None  # the mock's signing key, once a request has shown it
        self.unlisted = RSAKey.generate_key(2048)
        self._lock = threading.Lock()

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "GET")
        if path == "/_test/tamper" and method == "POST":
            mode = json.loads(_body(environ) or b"{}").get("mode")
            if mode not in TAMPER_MODES:
                return _json(start_response, 400, {"error": f"mode must be one of {TAMPER_MODES}"})
            self.tamper = mode
            return _json(start_response, 204, None)
        if path == "/_test/pkce":
            return _json(start_response, 200, self.counts)
        if path == "/oauth2/authorize":
            return self._authorize(environ, start_response)
        if path == "/oauth2/token" and method == "POST":
            return self._token(environ, start_response)
        return self.app(environ, start_response)

    def _authorize(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        query = parse_qs(environ.get("QUERY_STRING", ""))
        challenge = query.get("code_challenge", [""])[0]
        if not challenge or query.get("code_challenge_method", [""])[0] != "S256":
            return _text(start_response, 400, "invalid_request: PKCE is required (an S256 code_challenge)")
        status, headers, body = _call(self.app, environ)
        location = dict(headers).get("Location", "")
        code = parse_qs(urlsplit(location).query).get("code", [""])[0]
        if code:
            with self._lock:
                self.challenges[code] = challenge
        start_response(status, headers)
        return [body]

    def _token(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        raw = _body(environ)
        form = parse_qs(raw.decode())
        code = form.get("code", [""])[0]
        with self._lock:
            challenge = self.challenges.get(code)
        if form.get("grant_type", [""])[0] == "authorization_code" and challenge is not None:
            verifier = form.get("code_verifier", [""])[0].encode()
            computed = base64.urlsafe_b64encode(hashlib.sha256(verifier).digest()).rstrip(b"=").decode()
            with self._lock:
                self.counts["checked"] += 1
                if computed != challenge:
                    self.counts["refused"] += 1
            if computed != challenge:
                error = {"error": "invalid_grant", "error_description": "PKCE: the code_verifier does not match"}
                return _json(start_response, 400, error)
        environ["wsgi.input"], environ["CONTENT_LENGTH"] = io.BytesIO(raw), str(len(raw))
        status, headers, body = _call(self.app, environ)
        mode, self.tamper = self.tamper, None
        if mode is not None and status.startswith("200"):
            token = json.loads(body)
            token["id_token"] = self._altered(token["id_token"], mode)
            body = json.dumps(token).encode()
            headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
            headers.append(("Content-Length", str(len(body))))
        start_response(status, headers)
        return [body]

    def _altered(self, id_token: str, mode: str) -> str:
        """The ID token with the fault `mode` names, signed so that only that fault is wrong."""
        compact = jws.extract_compact(id_token.encode())
        claims = json.loads(compact.payload)
        now = int(time.time())
        if mode == "audience":
            client = claims["aud"][0] if isinstance(claims["aud"], list) else claims["aud"]
            claims["aud"], claims["azp"] = "another-client", client  # azp still names the client that asked
        elif mode == "expired":
            claims["iat"], claims["exp"] = now - 7200, now - 3600
        elif mode == "short-lived":
            claims["exp"] = now + SHORT_LIVED_S
        elif mode == "nonce":
            claims["nonce"] = "not-the-nonce-that-was-sent"
        key = self.unlisted if mode == "other-key" else self.provider_key
        assert key is not None, "the provider's key is known once it has answered a request"
        return jwt.encode(compact.headers(), claims, key, algorithms=["RS256"])

    def keep_provider_key(self, jwk: dict[str, Any]) -> None:
        """Remember the mock's signing key (a private JWK), to sign altered ID tokens as it does."""
        if self.provider_key is None:
            self.provider_key = RSAKey.import_key(jwk)


def _body(environ: Environ) -> bytes:
    length = int(environ.get("CONTENT_LENGTH") or 0)
    return bytes(environ["wsgi.input"].read(length)) if length else b""


def _call(app: Callable[[Environ, StartResponse], Iterable[bytes]], environ: Environ) -> tuple[str, list[Any], bytes]:
    """Run the inner app and keep its whole answer, to look at or change it."""
    seen: dict[str, Any] = {}

    def start(status: str, headers: list[Any], exc_info: Any = None) -> None:
        seen.update(status=status, headers=list(headers))

    chunks = app(environ, start)
    try:
        body = b"".join(chunks)
    finally:
        if hasattr(chunks, "close"):
            chunks.close()
    return seen["status"], seen["headers"], body


def _json(start_response: StartResponse, status: int, value: Any) -> list[bytes]:
    body = b"" if value is None else json.dumps(value).encode()
    reason = {200: "OK", 204: "No Content", 400: "Bad Request"}[status]
    start_response(f"{status} {reason}", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]


def _text(start_response: StartResponse, status: int, text: str) -> list[bytes]:
    body = text.encode()
    start_response(f"{status} Bad Request", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


def start_provider(log: Path, env: dict[str, str] | None = None, port: int | None = None) -> tuple[str, Process]:
    """Start the provider in a process of its own; returns its issuer (`http://localhost:PORT`) and the process.

    Raises:
        AssertionError: it did not answer its discovery within 30 s (its log is in the message).
    """
    port = port or free_port()
    args = [sys.executable, "-m", "mcp_celery.testing.oidc_provider", "--port", str(port)]
    proc = Process(args, {**(env or os.environ)}, log)
    issuer = f"http://localhost:{port}"
    proc.wait_ready(lambda: _discovery_answers(issuer), 30, "the OpenID Connect provider")
    return issuer, proc


def _discovery_answers(issuer: str) -> bool:
    try:
        return httpx.get(f"{issuer}/.well-known/openid-configuration", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m mcp_celery.testing.oidc_provider --port N`: serve until stopped."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=9400)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (a loopback one)")
    args = parser.parse_args(argv)
    os.environ["AUTHLIB_INSECURE_TRANSPORT"] = "1"  # the mock's own switch for http:// on loopback
    # The provider and its web stack are dev dependencies: loaded here, in its own process, never by an import.
    import flask
    from oidc_provider_mock import app as provider_app
    from werkzeug.serving import make_server

    mock = provider_app(require_nonce=True)
    checked = Checked(mock)

    def keep_key() -> None:  # runs after the mock's own hook, which puts its storage (and key) on `g`
        checked.keep_provider_key(flask.g.oidc_provider_mock_storage.jwk.as_dict(is_private=True))

    mock.before_request(keep_key)
    server = make_server(args.host, args.port, checked, threaded=True)
    print(f"OpenID Connect provider at http://localhost:{args.port} (PKCE enforced)", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
