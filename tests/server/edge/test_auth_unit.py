"""The token verifiers, the limit checks and the exposure rules, on their own (no server, no worker).

JWTs are signed here with locally generated keys; the JWKS is a tmp file, or an https URL
answered by an in-process httpx transport that counts fetches (no network).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from joserfc import jwt
from joserfc.jwk import ECKey, KeySet, OctKey, RSAKey
from mcp.shared.exceptions import MCPError

from mcp_celery.errors import ConfigurationError
from mcp_celery.redact import redact
from mcp_celery.server.edge import auth, hosts, limits, tokens
from mcp_celery.settings import Settings
from tests.support.harness import ROOT

ISSUER, AUDIENCE = "https://idp.test", "https://jobs.test/mcp"


def run(coro_fn: Any, *args: Any) -> Any:
    return anyio.run(coro_fn, *args)


# ---------------------------------------------------------------- static tokens


def test_new_token_stores_only_its_digest_and_the_verifier_names_its_principal(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("# team tokens\n\n")
    alice = tokens.new_token("alice", path)
    bob = tokens.new_token("bob@example.com", path)
    text = path.read_text()
    assert alice not in text and bob not in text
    assert f"alice {tokens.hash_token(alice)}" in text
    assert len(alice) >= 43  # 32 random bytes, base64url
    verifier = auth.StaticTokenVerifier(path)
    found = run(verifier.verify_token, alice)
    assert found is not None and found.client_id == "alice"
    assert run(verifier.verify_token, bob).client_id == "bob@example.com"
    assert run(verifier.verify_token, alice + "x") is None
    assert run(verifier.verify_token, "") is None


def test_the_static_verifier_sees_tokens_added_after_it_started(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    tokens.new_token("alice", path)
    assert path.stat().st_mode & 0o777 == 0o600  # a new file is readable by its owner only
    verifier = auth.StaticTokenVerifier(path)
    late = tokens.new_token("carol", path)
    assert run(verifier.verify_token, late).client_id == "carol"


def token_new(path: Path, principal: str) -> subprocess.CompletedProcess[str]:
    """`mcp-celery token new --file PATH PRINCIPAL`, as an operator runs it."""
    argv = [sys.executable, "-m", "mcp_celery", "token", "new", "--file", str(path), principal]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_token_new_creates_the_missing_folders_of_its_file_or_says_in_one_line_why_it_cannot(tmp_path: Path) -> None:
    path = tmp_path / "etc" / "mcp-celery" / "tokens"  # as /etc/mcp-celery/tokens on a fresh machine
    done = token_new(path, "alice")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert path.parent.stat().st_mode & 0o777 == 0o700 and path.stat().st_mode & 0o777 == 0o600
    assert run(auth.StaticTokenVerifier(path).verify_token, done.stdout.strip()).client_id == "alice"
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    for inside, why in ((blocked / "tokens", f"{blocked} is a file"), (blocked / "x" / "tokens", "Not a directory")):
        refused = token_new(inside, "bob")  # a folder of the path is a file: nothing can create it
        assert refused.returncode == 2 and refused.stdout == "", refused.stdout
        assert refused.stderr == f"mcp-celery: cannot write the token file {inside}: {why}\n"


@pytest.mark.parametrize(
    "line", ["alice", "alice sha256:abc", "alice md5:" + "0" * 64, "al ice sha256:" + "0" * 64, "a sha256:" + "G" * 64]
)
def test_a_malformed_token_line_is_refused_with_its_line_number(tmp_path: Path, line: str) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"# comment\n{line}\n")
    with pytest.raises(ConfigurationError, match="line 2"):
        auth.StaticTokenVerifier(path)


def test_token_comments_and_trailing_comments_are_ignored(tmp_path: Path) -> None:
    token = "s3cret-token"
    path = tmp_path / "tokens"
    path.write_text(f"# who\nalice {tokens.hash_token(token)}  # laptop\n")
    assert run(auth.StaticTokenVerifier(path).verify_token, token).client_id == "alice"


# ---------------------------------------------------------------- JWT


def ec_key(kid: str) -> ECKey:
    return ECKey.generate_key("P-256", parameters={"kid": kid})


def sign(key: Any, alg: str = "ES256", kid: str | None = None, **claims: Any) -> str:
    now = int(time.time())
    body = {"iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "exp": now + 300, "nbf": now - 10, **claims}
    header = {"alg": alg, **({"kid": kid} if kid else {})}
    return jwt.encode(header, {k: v for k, v in body.items() if v is not None}, key)


def jwks_file(tmp_path: Path, *keys: Any) -> Path:
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(KeySet(list(keys)).as_dict(private=False)))
    return path


def verifier_for(path: Path, **kw: Any) -> auth.JwtVerifier:
    return auth.JwtVerifier(str(path), issuer=ISSUER, audience=AUDIENCE, **kw)


def test_a_valid_jwt_gives_its_subject_as_principal(tmp_path: Path) -> None:
    key = ec_key("k1")
    verifier = verifier_for(jwks_file(tmp_path, key))
    found = run(verifier.verify_token, sign(key, kid="k1", scope="jobs:run"))
    assert found is not None
    assert (found.client_id, found.subject, found.scopes, found.resource) == ("alice", "alice", ["jobs:run"], AUDIENCE)
    assert found.claims == {"iss": ISSUER}


def test_rsa_keys_and_a_custom_principal_claim(tmp_path: Path) -> None:
    key = RSAKey.generate_key(2048, parameters={"kid": "r1"})
    verifier = verifier_for(jwks_file(tmp_path, key), principal_claim="email")
    found = run(verifier.verify_token, sign(key, "RS256", "r1", email="alice@example.com"))
    assert found is not None and found.client_id == "alice@example.com"
    assert run(verifier.verify_token, sign(key, "RS256", "r1")) is None  # no email claim: no principal


@pytest.mark.parametrize(
    "claims",
    [
        {"exp": int(time.time()) - 3600},  # expired (beyond the 30 s leeway)
        {"nbf": int(time.time()) + 3600},  # not yet valid
        {"iss": "https://evil.test"},
        {"aud": "https://other.test/mcp"},
        {"exp": None},  # exp is required
        {"sub": ""},
        {"sub": 42},
    ],
)
def test_jwt_claims_are_checked(tmp_path: Path, claims: dict[str, Any]) -> None:
    key = ec_key("k1")
    verifier = verifier_for(jwks_file(tmp_path, key))
    assert run(verifier.verify_token, sign(key, kid="k1")) is not None  # the same token minus the fault passes
    assert run(verifier.verify_token, sign(key, kid="k1", **claims)) is None


def test_a_forged_signature_hmac_and_garbage_are_refused(tmp_path: Path) -> None:
    key = ec_key("k1")
    verifier = verifier_for(jwks_file(tmp_path, key))
    assert run(verifier.verify_token, sign(ec_key("k1"), kid="k1")) is None  # another key claiming kid k1
    good = sign(key, kid="k1")
    head, body, signature = good.split(".")
    assert run(verifier.verify_token, f"{head}.{body}.{signature[::-1]}") is None
    assert run(verifier.verify_token, sign(OctKey.generate_key(256), "HS256", "k1")) is None
    for junk in ["", "a.b.c", "not a token", good + ".", "..."]:
        assert run(verifier.verify_token, junk) is None


def test_a_token_without_kid_needs_a_single_key_set(tmp_path: Path) -> None:
    key = ec_key("k1")
    assert run(verifier_for(jwks_file(tmp_path, key)).verify_token, sign(key)) is not None
    assert run(verifier_for(jwks_file(tmp_path, key, ec_key("k2"))).verify_token, sign(key)) is None


def test_a_rotated_key_in_the_file_is_picked_up_on_an_unknown_kid(tmp_path: Path) -> None:
    old, new = ec_key("old"), ec_key("new")
    path = jwks_file(tmp_path, old)
    verifier = verifier_for(path)
    jwks_file(tmp_path, old, new)
    assert run(verifier.verify_token, sign(new, kid="new")) is not None


def test_a_missing_jwks_file_fails_at_startup(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="JWKS file"):
        verifier_for(tmp_path / "absent.json")
    with pytest.raises(ConfigurationError, match="https"):
        auth.JwtVerifier("http://idp.test/jwks", issuer=ISSUER, audience=AUDIENCE)


class CountingJwks:
    """An in-process https JWKS endpoint whose key set can change; counts fetches."""

    def __init__(self, *keys: Any) -> None:
        self.keys = list(keys)
        self.fetches = 0

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.fetches += 1
        assert str(request.url) == "https://idp.test/jwks"
        return httpx.Response(200, json=KeySet(self.keys).as_dict(private=False))


def test_a_jwks_url_is_fetched_once_cached_and_refetched_on_an_unknown_kid(monkeypatch: pytest.MonkeyPatch) -> None:
    k1, k2 = ec_key("k1"), ec_key("k2")
    endpoint = CountingJwks(k1)

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(endpoint.handle)) as http:
            verifier = auth.JwtVerifier("https://idp.test/jwks", issuer=ISSUER, audience=AUDIENCE, http=http)
            assert endpoint.fetches == 0  # lazily, at the first token
            for _ in range(3):
                assert await verifier.verify_token(sign(k1, kid="k1")) is not None
            assert endpoint.fetches == 1
            endpoint.keys.append(k2)
            # Within the refetch interval an unknown kid does not reach the issuer again.
            assert await verifier.verify_token(sign(k2, kid="k2")) is None
            assert endpoint.fetches == 1
            monkeypatch.setattr(auth, "JWKS_REFETCH_S", 0.0)
            assert await verifier.verify_token(sign(k2, kid="k2")) is not None
            assert endpoint.fetches == 2
            assert await verifier.verify_token(sign(k1, kid="k1")) is not None
            assert endpoint.fetches == 2

    anyio.run(scenario)


# ---------------------------------------------------------------- wiring


def test_build_verifier_needs_an_issuer_and_combines_both_kinds(tmp_path: Path) -> None:
    key = ec_key("k1")
    jwks = jwks_file(tmp_path, key)
    assert auth.build_verifier(Settings(), AUDIENCE) is None
    with pytest.raises(ConfigurationError, match="ISSUER"):
        auth.build_verifier(Settings(jwt_jwks=str(jwks)), AUDIENCE)
    token_file = tmp_path / "tokens"
    static = tokens.new_token("bob", token_file)
    both = auth.build_verifier(Settings(auth_tokens=str(token_file), jwt_jwks=str(jwks), jwt_issuer=ISSUER), AUDIENCE)
    assert both is not None
    assert run(both.verify_token, static).client_id == "bob"
    assert run(both.verify_token, sign(key, kid="k1")).client_id == "alice"  # audience defaults to the resource URL
    with pytest.raises(ConfigurationError, match="cannot read"):
        auth.build_verifier(Settings(auth_tokens=str(tmp_path / "absent")), AUDIENCE)


def test_only_loopback_may_be_served_without_authentication() -> None:
    for host in auth.LOOPBACK:
        auth.check_exposure(Settings(), host, allow_unauthenticated=False)
    auth.check_exposure(Settings(), "0.0.0.0", allow_unauthenticated=True)
    auth.check_exposure(Settings(auth_tokens="/x"), "0.0.0.0", allow_unauthenticated=False)
    with pytest.raises(ConfigurationError, match="--allow-unauthenticated"):
        auth.check_exposure(Settings(), "0.0.0.0", allow_unauthenticated=False)


def test_allowed_hosts_extend_the_loopback_defaults() -> None:
    default = hosts.transport_security(Settings())
    assert default.enable_dns_rebinding_protection and "localhost:*" in default.allowed_hosts
    assert not any("example" in h for h in default.allowed_hosts)
    named = hosts.transport_security(Settings(allowed_hosts="mcp.example.com, jobs.example.com:8443"))
    assert {"mcp.example.com", "mcp.example.com:*", "jobs.example.com:8443", "127.0.0.1:*"} <= set(named.allowed_hosts)
    assert "jobs.example.com:8443:*" not in named.allowed_hosts
    assert "https://mcp.example.com" in named.allowed_origins
    assert not hosts.transport_security(Settings(allowed_hosts="*")).enable_dns_rebinding_protection


# ---------------------------------------------------------------- limits and error text


def test_json_depth_is_counted_without_recursion() -> None:
    assert limits.json_depth(1, 10) == 0
    assert limits.json_depth({"a": [1, {"b": []}]}, 10) == 4
    deep: Any = []
    for _ in range(100_000):  # far past the interpreter's recursion limit
        deep = [deep]
    assert limits.json_depth(deep, 32) == 33  # stops counting past the limit


def test_limit_errors_name_their_setting() -> None:
    settings = Settings(max_json_depth=3, max_argument_bytes=50, max_input_response_keys=2)
    limits.check_arguments(settings, {"a": [[1]]})
    with pytest.raises(MCPError, match="MCP_CELERY_MAX_JSON_DEPTH") as deep:
        limits.check_arguments(settings, {"a": [[[1]]]})
    assert deep.value.error.code == -32602
    with pytest.raises(MCPError, match="MCP_CELERY_MAX_ARGUMENT_BYTES"):
        limits.check_arguments(settings, {"a": "x" * 60})
    with pytest.raises(MCPError, match="MCP_CELERY_MAX_INPUT_RESPONSE_KEYS"):
        limits.check_input_responses(settings, {"a": 1, "b": 2, "c": 3})
    assert not limits.task_id_acceptable(settings, "x" * 129) and limits.task_id_acceptable(settings, "x" * 128)


def test_redact_hides_url_passwords_only() -> None:
    assert redact("Error connecting to redis://:hunter2@db:6379/0") == "Error connecting to redis://:***@db:6379/0"
    assert redact("amqp://guest:pa:ss@mq//") == "amqp://guest:***@mq//"
    assert (
        redact("see https://example.com/a:b and user@example.com") == "see https://example.com/a:b and user@example.com"
    )
    settings_debug, settings = Settings(debug=True), Settings()
    exc = ConnectionError("cannot reach postgresql://app:topsecret@db/app")
    assert "topsecret" not in limits.describe(exc, settings) and "db/app" not in limits.describe(exc, settings)
    assert limits.describe(exc, settings_debug) == "ConnectionError: cannot reach postgresql://app:***@db/app"


def test_safe_errors_turns_an_unexpected_exception_into_a_bare_internal_error() -> None:
    async def leaky(ctx: Any, params: Any) -> None:
        raise RuntimeError("bad state talking to amqp://jobs:topsecret@mq:5672//")

    async def unreachable(ctx: Any, params: Any) -> None:
        raise ConnectionError("cannot reach amqp://jobs:topsecret@mq:5672//")

    async def refusing(ctx: Any, params: Any) -> None:
        raise MCPError(-32602, "Failed to retrieve task: Task not found")

    cases = [
        (Settings(), leaky, "internal error"),
        (Settings(debug=True), leaky, "amqp://jobs:***@mq:5672//"),
        (Settings(), unreachable, "the broker or Redis is unreachable right now"),  # worth a retry, and says so
        (Settings(debug=True), unreachable, "ConnectionError: cannot reach amqp://jobs:***@mq:5672//"),
    ]
    for settings, handler, shown in cases:
        with pytest.raises(MCPError) as caught:
            run(limits.safe_errors(settings, handler), None, None)
        assert caught.value.error.code == -32603 and shown in caught.value.error.message, caught.value.error
        assert "topsecret" not in caught.value.error.message
    with pytest.raises(MCPError) as passed:  # the handler's own JSON-RPC errors pass unchanged
        run(limits.safe_errors(Settings(), refusing), None, None)
    assert passed.value.error.code == -32602


def test_serving_a_public_address_without_allowed_hosts_warns_how_to_fix_it(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="mcp_celery.auth"):
        options = auth.http_app_options(Settings(), "0.0.0.0", 8000)
    assert "MCP_CELERY_ALLOWED_HOSTS" in caplog.text
    # The SDK's own Host check is off: `hosts.HostCheck` checks in front of the whole app instead.
    assert "token_verifier" not in options and not options["transport_security"].enable_dns_rebinding_protection
    caplog.clear()
    with caplog.at_level("WARNING", logger="mcp_celery.auth"):
        auth.http_app_options(Settings(allowed_hosts="jobs.example.com"), "0.0.0.0", 8000)
        auth.http_app_options(Settings(), "127.0.0.1", 8000)
    assert caplog.text == ""
