"""Security end to end: real server processes with authentication, the suite's prefork worker, real Redis.

Principals alice, bob and carol hold static tokens; a JWT signed by a local key speaks for
alice too. The server runs with small limits so that each one can be crossed cheaply.
"""

from __future__ import annotations

import getpass
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from joserfc import jwt
from joserfc.jwk import ECKey, KeySet
from kombu import Queue

from mcp_celery.server.edge import tokens
from mcp_celery.store.schema import Keys
from tests.support import sample_jobs
from tests.support.harness import (
    ROOT,
    HttpClient,
    Process,
    StdioClient,
    free_port,
    modern_meta,
    start_http_server,
    wait_for,
)

ISSUER, AUDIENCE = "https://idp.test", "https://jobs.test/mcp"
NOT_FOUND = {"code": -32602, "message": "Failed to retrieve task: Task not found"}
LIMITS = {
    "MCP_CELERY_MAX_REQUEST_BYTES": "65536",
    "MCP_CELERY_MAX_ARGUMENT_BYTES": "4096",
    "MCP_CELERY_MAX_JSON_DEPTH": "8",
    "MCP_CELERY_MAX_INPUT_RESPONSE_KEYS": "4",
    "MCP_CELERY_MAX_INPUT_RESPONSE_BYTES": "2048",
    "MCP_CELERY_MAX_TASK_ID_LENGTH": "64",
    "MCP_CELERY_MAX_LIVE_TASKS_PER_PRINCIPAL": "3",
    "MCP_CELERY_ALLOWED_HOSTS": "mcp.example.com",
}


class Secrets:
    def __init__(self, root: Path) -> None:
        self.token_file = root / "tokens"
        self.tokens = {name: tokens.new_token(name, self.token_file) for name in ("alice", "bob", "carol")}
        self.key = ECKey.generate_key("P-256", parameters={"kid": "k1"})
        self.jwks = root / "jwks.json"
        self.jwks.write_text(json.dumps(KeySet([self.key]).as_dict(private=False)))

    def jwt(self, sub: str, **claims: Any) -> str:
        now = int(time.time())
        body = {"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "exp": now + 600, "nbf": now - 5, **claims}
        return jwt.encode({"alg": "ES256", "kid": "k1"}, body, self.key)


@pytest.fixture(scope="module")
def secrets_(tmp_path_factory: pytest.TempPathFactory) -> Secrets:
    return Secrets(tmp_path_factory.mktemp("secrets"))


@pytest.fixture(scope="module")
def auth_env(env: dict[str, str], secrets_: Secrets) -> dict[str, str]:
    return {
        **env,
        **LIMITS,
        "MCP_CELERY_AUTH_TOKENS": str(secrets_.token_file),
        "MCP_CELERY_JWT_JWKS": str(secrets_.jwks),
        "MCP_CELERY_JWT_ISSUER": ISSUER,
        "MCP_CELERY_JWT_AUDIENCE": AUDIENCE,
    }


@pytest.fixture(scope="module")
def auth_url(auth_env: dict[str, str], worker: Process, logs: Path) -> Iterator[str]:
    url, server = start_http_server(auth_env, logs / "auth-server.log")
    yield url
    assert server.alive(), server.output()
    server.stop()


@pytest.fixture
def clients(auth_url: str, secrets_: Secrets) -> Iterator[dict[str, HttpClient]]:
    made = {name: HttpClient(auth_url, token) for name, token in secrets_.tokens.items()}
    made["alice-jwt"] = HttpClient(auth_url, secrets_.jwt("alice"))
    made["nobody"] = HttpClient(auth_url)
    yield made
    for c in made.values():
        c.close()


def task_keys(store: redis.Redis) -> set[bytes]:
    return {k for k in store.scan_iter("mcp-celery:task:*") if k.count(b":") == 2}


def error_of(reply: dict[str, Any]) -> dict[str, Any]:
    assert "error" in reply and "result" not in reply, reply
    return dict(reply["error"])


# ---------------------------------------------------------------- authentication


def test_no_or_a_bad_token_gets_401_with_www_authenticate_and_nothing_happens(
    auth_url: str, secrets_: Secrets, store_redis: redis.Redis
) -> None:
    before = task_keys(store_redis)
    bad = [None, "wrong", secrets_.tokens["alice"] + "x", secrets_.jwt("alice", exp=int(time.time()) - 3600),
           secrets_.jwt("alice", iss="https://evil.test"), secrets_.jwt("alice", aud="https://other.test")]  # fmt: skip
    for token in bad:
        c = HttpClient(auth_url, token)
        response = c.post("tools/call", {"name": "echo", "arguments": {"text": "x"}})
        c.close()
        assert response.status_code == 401, (token, response.text)
        challenge = response.headers["www-authenticate"]
        assert challenge.startswith("Bearer ") and 'error="invalid_token"' in challenge
        assert "resource_metadata=" in challenge and "/.well-known/oauth-protected-resource" in challenge
    assert task_keys(store_redis) == before


def test_protected_resource_metadata_is_published(auth_url: str) -> None:  # RFC 9728
    origin = auth_url.removesuffix("/mcp")
    metadata = httpx.get(f"{origin}/.well-known/oauth-protected-resource/mcp").json()
    assert metadata["resource"].startswith(origin) and metadata["resource"].endswith("/mcp")
    assert metadata["authorization_servers"] == [ISSUER]


def test_a_static_token_and_a_jwt_with_the_same_principal_share_its_tasks(clients: dict[str, HttpClient]) -> None:
    task_id = clients["alice"].start("echo", {"text": "shared"})
    assert clients["alice-jwt"].wait(task_id)["result"]["content"][0]["text"] == "shared"
    assert error_of(clients["bob"].call("tasks/get", {"taskId": task_id})) == NOT_FOUND


def test_token_new_creates_the_token_files_folder(tmp_path: Path) -> None:
    path = tmp_path / "etc" / "mcp-celery" / "tokens"
    out = subprocess.run(
        [sys.executable, "-m", "mcp_celery", "token", "new", "erin", "--file", str(path)],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert tokens.parse_token_file(path.read_text()) == [("erin", tokens.hash_token(out.stdout.strip()).encode())]
    assert (path.stat().st_mode & 0o777, path.parent.stat().st_mode & 0o777) == (0o600, 0o700)
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    refused = subprocess.run(
        [sys.executable, "-m", "mcp_celery", "token", "new", "erin", "--file", str(blocked / "tokens")],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.startswith(f"mcp-celery: cannot write the token file {blocked / 'tokens'}: "), refused.stderr


def test_a_token_added_with_the_cli_works_without_a_restart(auth_url: str, secrets_: Secrets) -> None:
    name = f"dave-{uuid.uuid4().hex[:6]}"
    out = subprocess.run(
        [sys.executable, "-m", "mcp_celery", "token", "new", name, "--file", str(secrets_.token_file)],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    token = out.stdout.strip()
    assert len(token) >= 43 and token not in secrets_.token_file.read_text()
    c = HttpClient(auth_url, token)
    assert c.wait(c.start("echo", {"text": "dave"}))["status"] == "completed"
    c.close()


# ---------------------------------------------------------------- authorization


def test_another_principals_task_answers_exactly_like_an_unknown_one_and_is_unaffected(
    clients: dict[str, HttpClient], store_redis: redis.Redis
) -> None:
    alice, bob = clients["alice"], clients["bob"]
    waiting = alice.start("ask_one", {"timeout": 60}, elicitation={})
    asked = alice.wait(waiting, {"input_required"})
    running = alice.start("checkpoint_loop", {"seconds": 60})  # still working at the end, however slow the machine
    unknown = "x" + waiting[1:]
    key = next(iter(asked["inputRequests"]))
    answers = {"inputResponses": {key: {"action": "accept", "content": {"confirm": True}}}}
    for task_id in (waiting, running):
        for method, extra in (("tasks/get", {}), ("tasks/update", answers), ("tasks/cancel", {})):
            foreign = error_of(bob.call(method, {"taskId": task_id, **extra}))
            missing = error_of(bob.call(method, {"taskId": unknown, **extra}))
            anonymous_id = error_of(alice.call(method, {"taskId": unknown, **extra}))
            assert foreign == missing == anonymous_id == NOT_FOUND, method
    # Listening is authorized the same way: bob's acknowledgement leaves alice's tasks out.
    stream = bob.stream("subscriptions/listen", {"notifications": {"taskIds": [waiting, running, unknown]}})
    ack = stream.next()
    assert ack is not None and ack["params"]["notifications"]["taskIds"] == [], ack
    end = stream.next()  # nothing to watch: the stream ends at once, without a notification
    assert end is not None and end.get("id") == stream.request_id and "result" in end, end
    stream.close()
    stream = alice.stream("subscriptions/listen", {"notifications": {"taskIds": [waiting, unknown]}})
    ack = stream.next()
    assert ack is not None and ack["params"]["notifications"]["taskIds"] == [waiting], ack
    stream.close()
    # Nothing bob sent reached alice's tasks: no cancel flag, no answer, the question still open.
    for task_id in (waiting, running):
        assert store_redis.hget(Keys().task(task_id), "cancel") is None
    assert not store_redis.exists(Keys().answers(waiting))
    still = alice.get(waiting)
    assert still["status"] == "input_required" and still["inputRequests"] == asked["inputRequests"]
    assert alice.get(running)["status"] == "working"
    alice.result("tasks/update", {"taskId": waiting, **answers})
    assert alice.wait(waiting)["result"]["content"][0]["text"] == "published"
    alice.result("tasks/cancel", {"taskId": running})  # what bob's cancel could not do, its owner's does
    assert alice.wait(running)["status"] == "cancelled"


def test_task_ids_carry_192_random_bits(clients: dict[str, HttpClient]) -> None:
    ids = {clients["carol"].start("echo", {"text": str(i)}) for i in range(3)}
    for task_id in ids:  # 24 random bytes, base64url: 32 characters of 6 bits each
        assert len(task_id) == 32 and set(task_id) <= set(
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
        )
    assert len(ids) == 3
    for task_id in ids:
        clients["carol"].wait(task_id)


def test_stdio_tasks_belong_to_the_local_user(stdio: StdioClient, store_redis: redis.Redis) -> None:
    reply = stdio.request("tools/call", {"name": "echo", "arguments": {"text": "mine"}})
    task_id = reply["result"]["taskId"]
    assert store_redis.hget(Keys().task(task_id), "owner") == getpass.getuser().encode()
    assert stdio.request("tasks/get", {"taskId": task_id})["result"]["taskId"] == task_id


# ---------------------------------------------------------------- quota


def test_over_the_live_task_quota_nothing_is_queued(clients: dict[str, HttpClient], store_redis: redis.Redis) -> None:
    carol = clients["carol"]
    marker = f"quota-{uuid.uuid4()}"
    # `queued_elsewhere` goes to a queue no worker consumes: the tasks stay live.
    held = [carol.start("queued_elsewhere", {"marker": marker}) for _ in range(3)]
    before = task_keys(store_redis)
    refused = error_of(carol.call("tools/call", {"name": "echo", "arguments": {"text": "one too many"}}))
    assert refused["code"] == -32600 and "MCP_CELERY_MAX_LIVE_TASKS_PER_PRINCIPAL" in refused["message"]
    assert refused["data"] == {"liveTasks": 3, "limit": 3}
    sync = error_of(carol.call("tools/call", {"name": "sync_only", "arguments": {"text": "x"}}, capabilities={}))
    assert sync["code"] == -32600
    assert task_keys(store_redis) == before  # no record written, nothing queued
    bobs = clients["bob"].wait(clients["bob"].start("echo", {"text": "bob is not limited by carol"}))
    assert (bobs["status"], bobs["result"]["content"][0]["text"]) == ("completed", "bob is not limited by carol")
    carol.result("tasks/cancel", {"taskId": held[0]})  # a cancelled task no longer counts
    assert carol.wait(carol.start("echo", {"text": "room again"}))["status"] == "completed"
    for task_id in held[1:]:
        carol.result("tasks/cancel", {"taskId": task_id})


# ---------------------------------------------------------------- hostile input


def raw_post(
    url: str, token: str | None, body: bytes, version: str | None = "2026-07-28", **headers: str
) -> httpx.Response:
    """POST `body` as is; `version=None` sends no MCP-Protocol-Version (the SDK's initialize-era transport)."""
    hdrs = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers}
    if token is not None:
        hdrs["Authorization"] = f"Bearer {token}"
    if version is not None:
        hdrs["MCP-Protocol-Version"] = version
    return httpx.post(url, content=body, headers=hdrs, timeout=30)


def test_a_body_over_the_http_limit_gets_413_naming_the_setting(auth_url: str, secrets_: Secrets) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"x": "y" * 70_000}})
    response = raw_post(auth_url, secrets_.tokens["alice"], body.encode())
    assert response.status_code == 413
    assert response.text == "Request body too large: the limit is 65536 bytes (MCP_CELERY_MAX_REQUEST_BYTES)"
    assert int(response.headers["content-length"]) == len(response.content)


#: The error of JSON that is not a JSON-RPC message, over HTTP and stdio alike.
INVALID_REQUEST = {"code": -32600, "message": "Invalid Request"}
NOT_JSON_RPC = [
    b"[1, 2]",
    b'{"foo": 1}',
    b'"str"',
    b"42",
    b'{"jsonrpc": "2.0", "id": 1}',
    b'{"jsonrpc": "1.0", "id": 1, "method": "x"}',
]


def test_json_that_is_not_json_rpc_gets_invalid_request_over_http_without_a_validation_dump(
    auth_url: str, secrets_: Secrets, clients: dict[str, HttpClient]
) -> None:
    for body in NOT_JSON_RPC:
        for version in (None, "2025-06-18", "2026-07-28"):  # the initialize-era transport and the 2026-07-28 one
            response = raw_post(auth_url, secrets_.tokens["alice"], body, version)
            assert response.status_code == 400, (body, version, response.text)
            reply = response.json()
            # Exactly what stdio answers (below): no validation dump, no wording of one transport's own.
            assert reply == {"jsonrpc": "2.0", "id": None, "error": INVALID_REQUEST}, (body, version, reply)
        # Without a token nothing is parsed at all.
        assert raw_post(auth_url, None, body, None).status_code == 401
    assert clients["alice"].result("tools/list")["tools"]


def test_malformed_json_gets_a_parse_error_and_the_server_keeps_serving(
    auth_url: str, secrets_: Secrets, clients: dict[str, HttpClient]
) -> None:
    for junk in [b"{", b"\xff\xfe", b'{"jsonrpc": "2.0", "id": 1, "method": ', b"[" * 5000 + b"]" * 5000]:
        response = raw_post(auth_url, secrets_.tokens["alice"], junk)
        assert response.status_code < 500
        assert response.json()["error"]["code"] == -32700, junk[:20]
    assert clients["alice"].result("tools/list")["tools"]


def test_unreadable_stdio_lines_get_an_error_reply_and_the_server_keeps_serving(stdio: StdioClient) -> None:
    assert stdio.proc.stdout is not None
    unreadable = [("{", -32700), ("not json", -32700), ("[1]", -32600)]
    unreadable += [(body.decode(), -32600) for body in NOT_JSON_RPC]
    for line, code in unreadable:
        stdio.send_raw(line)
        reply = json.loads(stdio.proc.stdout.readline())
        assert reply == {"jsonrpc": "2.0", "id": None, "error": reply["error"]} and reply["error"]["code"] == code, line
        assert code != -32600 or reply["error"] == INVALID_REQUEST, line
    assert stdio.request("tools/list")["result"]["tools"]


def test_tool_arguments_too_deep_or_too_large_are_refused_before_queueing(
    clients: dict[str, HttpClient], store_redis: redis.Redis
) -> None:
    before = task_keys(store_redis)
    deep: Any = "x"
    for _ in range(9):
        deep = [deep]
    too_deep = error_of(clients["alice"].call("tools/call", {"name": "greeting", "arguments": {"name": deep}}))
    assert too_deep["code"] == -32602 and "MCP_CELERY_MAX_JSON_DEPTH" in too_deep["message"]
    big = error_of(clients["alice"].call("tools/call", {"name": "greeting", "arguments": {"name": "y" * 5000}}))
    assert big["code"] == -32602 and "MCP_CELERY_MAX_ARGUMENT_BYTES" in big["message"]
    assert task_keys(store_redis) == before


def test_input_responses_over_the_limits_are_refused_and_change_nothing(
    clients: dict[str, HttpClient], store_redis: redis.Redis
) -> None:
    alice = clients["alice"]
    task_id = alice.start("ask_one", {"timeout": 60}, elicitation={})
    alice.wait(task_id, {"input_required"})
    accept = {"action": "accept", "content": {"confirm": False}}
    many = error_of(
        alice.call("tasks/update", {"taskId": task_id, "inputResponses": {str(i): accept for i in range(5)}})
    )
    assert many["code"] == -32602 and "MCP_CELERY_MAX_INPUT_RESPONSE_KEYS" in many["message"]
    large = {"confirm": {"action": "accept", "content": {"confirm": False, "pad": "z" * 3000}}}
    big = error_of(alice.call("tasks/update", {"taskId": task_id, "inputResponses": large}))
    assert big["code"] == -32602 and "MCP_CELERY_MAX_INPUT_RESPONSE_BYTES" in big["message"]
    first_round = error_of(
        alice.call(
            "tools/call", {"name": "echo", "arguments": {"text": "x"}, "inputResponses": {str(i): {} for i in range(5)}}
        )
    )
    assert first_round["code"] == -32602
    assert not store_redis.exists(Keys().answers(task_id))
    assert alice.get(task_id)["status"] == "input_required"
    alice.result("tasks/cancel", {"taskId": task_id})


def test_an_overlong_task_id_is_an_unknown_task(clients: dict[str, HttpClient]) -> None:
    for method in ("tasks/get", "tasks/cancel"):
        assert error_of(clients["alice"].call(method, {"taskId": "a" * 65})) == NOT_FOUND


# ---------------------------------------------------------------- Host and Origin


def test_host_and_origin_checks_accept_loopback_and_the_configured_name_only(auth_url: str, secrets_: Secrets) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": modern_meta({})}})
    port = auth_url.split(":")[2].split("/")[0]

    def status(**headers: str) -> int:
        return raw_post(
            auth_url, secrets_.tokens["alice"], body.encode(), **{"Mcp-Method": "tools/list"}, **headers
        ).status_code

    assert status() == 200
    assert status(Host="mcp.example.com", Origin="https://mcp.example.com") == 200  # MCP_CELERY_ALLOWED_HOSTS
    assert status(Host=f"localhost:{port}", Origin=f"http://localhost:{port}") == 200
    assert status(Host="evil.example") == 421
    assert status(Origin="http://evil.example") == 403
    wrong_host = raw_post(auth_url, secrets_.tokens["alice"], body.encode(), Host="evil.example")
    assert "'evil.example'" in wrong_host.text and "MCP_CELERY_ALLOWED_HOSTS" in wrong_host.text
    wrong_origin = raw_post(auth_url, secrets_.tokens["alice"], body.encode(), Origin="http://evil.example")
    assert "'http://evil.example'" in wrong_origin.text and "MCP_CELERY_ALLOWED_HOSTS" in wrong_origin.text


def test_serving_other_machines_without_authentication_is_refused_in_one_line(env: dict[str, str]) -> None:
    app = "tests.support.sample_jobs"
    args = [sys.executable, "-m", "mcp_celery", "serve", "-A", app, "--http", "--host", "0.0.0.0"]
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "without authentication" in lines[0] and "--allow-unauthenticated" in lines[0]


def test_jwt_settings_without_an_issuer_stop_serve_in_one_line_before_any_worker_process(
    env: dict[str, str], secrets_: Secrets
) -> None:
    jwt_env = {**env, "MCP_CELERY_JWT_JWKS": str(secrets_.jwks)}
    args = [sys.executable, "-m", "mcp_celery", "serve", "-A", "tests.support.sample_jobs", "--http", "--workers", "2"]
    port = str(free_port())
    done = subprocess.run([*args, "--port", port], cwd=ROOT, env=jwt_env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == "mcp-celery: MCP_CELERY_JWT_JWKS is set but MCP_CELERY_JWT_ISSUER is not"


def test_allow_unauthenticated_serves_other_machines(env: dict[str, str], worker: Process, logs: Path) -> None:
    url, server = start_http_server(env, logs / "open-server.log", "--host", "0.0.0.0", "--allow-unauthenticated")
    c = HttpClient(url)
    try:
        assert c.wait(c.start("echo", {"text": "open"}))["status"] == "completed"
        # Only the loopback names pass the Host check yet: the startup log says what to set, and so
        # does the CLI of a client that reaches the server by another address (127.0.0.2 is loopback too).
        assert "421 otherwise); set MCP_CELERY_ALLOWED_HOSTS" in server.output()
        elsewhere = url.replace("127.0.0.1", "127.0.0.2")
        argv = [sys.executable, "-m", "mcp_celery", "call", "echo", "--args", '{"text": "x"}', "--url", elsewhere]
        client_env = {**env, "MCP_CELERY_CLIENT_JOURNAL": str(logs / "open-server-journal.db")}
        done = subprocess.run(argv, cwd=ROOT, env=client_env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2
        assert done.stderr.strip() == (
            "mcp-celery: 421: the server does not answer to the host name in --url (its MCP_CELERY_ALLOWED_HOSTS)"
        )
    finally:
        c.close()
        server.stop()


# ---------------------------------------------------------------- error text


def test_a_broker_password_never_reaches_the_client(env: dict[str, str], logs: Path, worker: Process) -> None:
    secret = f"pw-{uuid.uuid4().hex}"
    # Port 1 refuses connections: queueing fails, with the broker URL (and its password) in reach of the error.
    bad_env = {**env, "TEST_BROKER_URL": f"redis://:{secret}@127.0.0.1:1/0"}
    url, server = start_http_server(bad_env, logs / "bad-broker-server.log")
    c = HttpClient(url)
    try:
        error = error_of(c.call("tools/call", {"name": "echo", "arguments": {"text": "x"}}))
        assert error["code"] == -32603 and error["message"].startswith("could not queue the job")
        assert secret not in json.dumps(error) and "Traceback" not in json.dumps(error)
    finally:
        c.close()
        server.stop()


# ---------------------------------------------------------------- pickle


def publish(task_id: str, marker: str, serializer: str) -> None:
    """A `queued_elsewhere` message straight onto the worker's queue, bypassing apply_async."""
    app = sample_jobs.app
    name = sample_jobs.queued_elsewhere.name
    message = app.amqp.as_task_v2(task_id, name, args=(), kwargs={"marker": marker})
    with app.connection_for_write() as conn:
        producer = conn.Producer(serializer=serializer)
        producer.publish(
            message.body, routing_key="celery", declare=[Queue("celery")], headers=message.headers,
            serializer=serializer, **message.properties,
        )  # fmt: skip


def test_a_pickle_message_is_rejected_and_never_executed(worker: Process, store_redis: redis.Redis) -> None:
    assert sample_jobs.app.conf.accept_content == ["json"] and sample_jobs.app.conf.result_accept_content == ["json"]
    pickled, control = f"pickle-{uuid.uuid4()}", f"json-{uuid.uuid4()}"
    pickled_id = str(uuid.uuid4())
    publish(pickled_id, pickled, "pickle")
    wait_for(
        # The worker logs the refused body, which names the marker.
        lambda: "untrusted content of type pickle" in worker.output() and pickled in worker.output(),
        what="the worker to refuse the pickle message",
    )
    # The same message as JSON, published after it, runs: the worker saw the queue and went on.
    publish(str(uuid.uuid4()), control, "json")
    wait_for(lambda: store_redis.get(control), what="the JSON control message to run")
    assert store_redis.get(pickled) is None
    assert sample_jobs.app.AsyncResult(pickled_id).state == "PENDING"  # nothing stored for it either
