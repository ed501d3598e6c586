"""Property-based fuzzing of tools/call and the task methods, over HTTP and stdio.

Hypothesis throws well-formed, mutated and garbled JSON-RPC messages at a real server (the
suite's prefork worker runs whatever gets queued). Properties: every reply is a well-formed
JSON-RPC result or error, HTTP never answers 5xx, the server keeps serving, and a task owned by
another principal (the victim, created first) is byte for byte unchanged at the end.

MCP_CELERY_FUZZ_EXAMPLES sets the example count per transport (default 200); the run is
derandomized, so CI sees the same examples every time.
"""

from __future__ import annotations

import json
import os
import posixpath
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcp_celery.errors import ArtifactError
from mcp_celery.server.edge import tokens
from mcp_celery.store.artifact_files import FsspecArtifacts
from mcp_celery.store.artifacts import artifact_uri, check_name, parse_uri
from mcp_celery.store.schema import FIELD, Keys
from mcp_celery.testing.processes import stop_group
from tests.support import sample_jobs
from tests.support.harness import ROOT, HttpClient, Process, caps, modern_meta, start_http_server

EXAMPLES = int(os.environ.get("MCP_CELERY_FUZZ_EXAMPLES", "200"))
FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
METHODS = ["tools/call", "tasks/get", "tasks/update", "tasks/cancel"]
# Only tools whose arguments cannot make a job run long or grow without bound.
TOOLS = ["greeting", "add", "required_job", "sync_only", "boom", "protocol_fail", "delete_files", "no_such_tool"]
HTTP_STATUSES = {200, 202, 400, 404, 405, 406, 413}

# ---------------------------------------------------------------- strategies

scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)


def mostly(valid: st.SearchStrategy[Any], invalid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Four draws in five well formed, so most examples get past the envelope checks into the handlers."""
    return st.integers(0, 4).flatmap(lambda n: invalid if n == 4 else valid)


request_ids = mostly(st.integers(0, 2**31) | st.text(min_size=1, max_size=8), st.none() | st.floats() | st.booleans())
metas = mostly(
    st.sampled_from([modern_meta(caps()), modern_meta(caps(elicitation={})), modern_meta({})]),
    st.just({"io.modelcontextprotocol/protocolVersion": "1999"}) | st.dictionaries(st.text(max_size=8), json_values),
)
answers = st.fixed_dictionaries(
    {"action": st.sampled_from(["accept", "decline", "cancel", "x"])},
    optional={"content": st.dictionaries(st.text(max_size=6), json_values, max_size=3)},
)


@st.composite
def params_for(draw: st.DrawFn, method: str, task_ids: list[str]) -> dict[str, Any]:
    task_id = draw(mostly(st.sampled_from(task_ids), st.text(max_size=40) | st.just("a" * 300) | json_values))
    responses = st.dictionaries(st.text(max_size=10), answers | json_values, max_size=4)
    if method == "tools/call":
        out: dict[str, Any] = {
            "name": draw(mostly(st.sampled_from(TOOLS), st.text(max_size=10) | json_values)),
            "arguments": draw(st.dictionaries(st.sampled_from(["name", "a", "b", "text", "bucket", "count", "message"])
                                              | st.text(max_size=6), json_values, max_size=4) | json_values),
        }  # fmt: skip
        if draw(st.booleans()):
            out["inputResponses"] = draw(responses)
        return out
    if method == "tasks/update":
        return {"taskId": task_id, "inputResponses": draw(responses | json_values)}
    return {"taskId": task_id}


@st.composite
def messages(draw: st.DrawFn, task_ids: list[str]) -> tuple[bytes, dict[str, str]]:
    """(body, routing headers): a JSON-RPC request, often mutated, sometimes not JSON at all."""
    method = draw(mostly(st.sampled_from(METHODS), st.text(max_size=12)))
    params = draw(params_for(method if method in METHODS else draw(st.sampled_from(METHODS)), task_ids))
    # Hypothesis starts from the simplest draws (0, the first element): those are the well-formed cases.
    if draw(mostly(st.just(True), st.just(False))):
        params["_meta"] = draw(metas)
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": draw(request_ids), "method": method, "params": params}
    for _ in range(draw(mostly(st.just(0), st.integers(1, 3)))):  # structural mutations
        target = draw(st.sampled_from(["top", "params"]))
        holder = message if target == "top" or not isinstance(message.get("params"), dict) else message["params"]
        if holder:
            key = draw(st.sampled_from(sorted(holder)))
            if draw(st.booleans()):
                del holder[key]
            else:
                holder[key] = draw(json_values)
    headers = _routing_headers(message)
    body = json.dumps(message).encode()
    mode = draw(st.integers(0, 9))  # 0-5: as built
    if mode == 6:  # truncated
        body = body[: draw(st.integers(0, max(len(body) - 1, 0)))]
    elif mode == 7:  # a flipped byte
        at = draw(st.integers(0, len(body) - 1))
        body = body[:at] + bytes([draw(st.integers(0, 255))]) + body[at + 1 :]
    elif mode == 8:
        body = draw(st.binary(max_size=64))
    elif mode == 9:
        body = json.dumps([message]).encode()  # a batch
    return body, headers


def _routing_headers(message: Mapping[str, Any]) -> dict[str, str]:
    headers = {}
    method, params = message.get("method"), message.get("params")
    if isinstance(method, str) and method.isascii() and method.isprintable():
        headers["Mcp-Method"] = method
    if isinstance(params, dict):
        name = params.get("taskId", params.get("name"))
        if isinstance(name, str) and name and name.isascii() and name.isprintable():
            headers["Mcp-Name"] = name
    return headers


# ---------------------------------------------------------------- checks


def assert_jsonrpc(reply: Any) -> None:
    """A well-formed JSON-RPC 2.0 response: an id, and exactly one of a result object or an error."""
    assert isinstance(reply, dict) and reply.get("jsonrpc") == "2.0", reply
    assert "id" in reply, reply
    assert ("result" in reply) != ("error" in reply), reply
    if "error" in reply:
        error = reply["error"]
        assert isinstance(error.get("code"), int) and isinstance(error.get("message"), str), reply
        assert "Traceback" not in error["message"], reply
    else:
        assert isinstance(reply["result"], dict), reply


def snapshot(store: redis.Redis, task_id: str) -> dict[str, Any]:
    record = store.hgetall(Keys().task(task_id))
    # Fields only the victim's own job writes, never a request: its heartbeat moves on, and a fuzz run
    # longer than MCP_CELERY_PARK_AFTER_S (30 s, a loaded machine) parks it at its question.
    for field in (FIELD.ALIVE_UNTIL, FIELD.TAKEN, FIELD.PARKED, FIELD.RESUME):
        record.pop(field.encode(), None)
    return {
        "record": record,
        "answers": store.hgetall(Keys().answers(task_id)),
        "meta": store.get(sample_jobs.app.backend.get_key_for_task(task_id)),
    }


# ---------------------------------------------------------------- fixtures


class Principals:
    def __init__(self, root: Path) -> None:
        self.token_file = root / "tokens"
        self.fuzzer = tokens.new_token("fuzzer", self.token_file)
        self.victim = tokens.new_token("victim", self.token_file)


@pytest.fixture(scope="module")
def principals(tmp_path_factory: pytest.TempPathFactory) -> Principals:
    return Principals(tmp_path_factory.mktemp("fuzz-secrets"))


@pytest.fixture(scope="module")
def fuzz_env(env: dict[str, str], principals: Principals) -> dict[str, str]:
    # A quota bounds what the fuzzer can queue on the shared worker.
    return {**env, "MCP_CELERY_AUTH_TOKENS": str(principals.token_file), "MCP_CELERY_MAX_LIVE_TASKS_PER_PRINCIPAL": "4"}


@pytest.fixture(scope="module")
def fuzz_url(fuzz_env: dict[str, str], worker: Process, logs: Path) -> Iterator[str]:
    url, server = start_http_server(fuzz_env, logs / "fuzz-server.log")
    yield url
    server.stop()


@pytest.fixture(scope="module")
def victim_task(fuzz_url: str, principals: Principals, store_redis: redis.Redis) -> Iterator[str]:
    """A task of another principal, parked on a question for the whole fuzz run."""
    victim = HttpClient(fuzz_url, principals.victim)
    task_id = victim.start("ask_one", {"timeout": 600}, elicitation={})
    victim.wait(task_id, {"input_required"})
    yield task_id
    victim.result("tasks/cancel", {"taskId": task_id})
    victim.close()


def check_victim_unchanged(
    fuzz_url: str, principals: Principals, store: redis.Redis, task_id: str, before: Any
) -> None:
    assert snapshot(store, task_id) == before
    victim = HttpClient(fuzz_url, principals.victim)
    assert victim.get(task_id)["status"] == "input_required"
    victim.close()


# ---------------------------------------------------------------- HTTP


@pytest.mark.timeout(600)
def test_fuzz_http(fuzz_url: str, principals: Principals, victim_task: str, store_redis: redis.Redis) -> None:
    own = HttpClient(fuzz_url, principals.fuzzer)
    own_task = own.start("greeting", {"name": "fuzz"})
    before = snapshot(store_redis, victim_task)
    http = httpx.Client(timeout=30, headers={"Authorization": f"Bearer {principals.fuzzer}"})
    base = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2026-07-28"}  # fmt: skip
    seen: dict[str, int] = {}

    @FUZZ
    @given(messages([victim_task, own_task]))
    def one(case: tuple[bytes, dict[str, str]]) -> None:
        body, headers = case
        response = http.post(fuzz_url, content=body, headers={**base, **headers})
        assert response.status_code in HTTP_STATUSES, (response.status_code, response.text, body)
        if response.headers.get("content-type", "").startswith("application/json"):
            reply = response.json()
            assert_jsonrpc(reply)
            outcome = "result" if "result" in reply else str(reply["error"]["code"])
            if os.environ.get("FUZZ_DEBUG"):
                print(outcome, reply.get("error", {}).get("message", "")[:70])
        else:  # an HTTP-layer refusal or a notification's 202: no JSON-RPC body at all
            assert response.status_code != 200, (response.text, body)
            outcome = f"http {response.status_code}"
        seen[outcome] = seen.get(outcome, 0) + 1

    one()
    http.close()
    print("HTTP fuzz outcomes:", dict(sorted(seen.items())))
    # Most examples got past parsing into the handlers (else the fuzzer would only test the parser).
    assert (
        sum(n for k, n in seen.items() if k not in {"-32700", "-32600"} and not k.startswith("http")) > EXAMPLES // 4
    ), seen
    assert own.result("tools/list")["tools"]  # still serving
    own.close()
    check_victim_unchanged(fuzz_url, principals, store_redis, victim_task, before)


# ---------------------------------------------------------------- stdio


class LineReader:
    """The stdio server's output lines, read on a thread so that a silent server fails a deadline, not the run."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.lines: queue.Queue[bytes] = queue.Queue()
        assert proc.stdout is not None
        stdout = proc.stdout
        threading.Thread(
            target=lambda: [self.lines.put(line) for line in iter(stdout.readline, b"")], daemon=True
        ).start()

    def until(self, request_id: str, timeout: float = 30) -> list[Any]:
        """Every message up to and including the reply to `request_id`."""
        deadline = time.monotonic() + timeout
        out = []
        while True:
            line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.001))
            message = json.loads(line)
            out.append(message)
            if isinstance(message, dict) and message.get("id") == request_id:
                return out


@pytest.mark.timeout(600)
def test_fuzz_stdio(
    fuzz_env: dict[str, str], worker: Process, victim_task: str, fuzz_url: str, principals: Principals,
    store_redis: redis.Redis, logs: Path,
) -> None:  # fmt: skip
    log = (logs / "fuzz-stdio.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mcp_celery", "serve", "-A", "tests.support.sample_jobs"],
        cwd=ROOT, env=fuzz_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, start_new_session=True,
    )  # fmt: skip
    reader = LineReader(proc)
    counter = iter(range(1_000_000))

    def send(line: bytes) -> None:
        assert proc.stdin is not None
        proc.stdin.write(line.replace(b"\n", b" ").replace(b"\r", b" ") + b"\n")
        proc.stdin.flush()

    def sentinel() -> list[Any]:
        """A tools/list after the fuzz line: every message before its reply must be well formed too."""
        request_id = f"sentinel-{next(counter)}"
        send(json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/list",
                         "params": {"_meta": modern_meta(caps())}}).encode())  # fmt: skip
        return reader.until(request_id)

    try:
        create = {"name": "greeting", "arguments": {"name": "fuzz"}, "_meta": modern_meta(caps())}
        send(json.dumps({"jsonrpc": "2.0", "id": "own", "method": "tools/call", "params": create}).encode())
        own_task = reader.until("own")[-1]["result"]["taskId"]
        before = snapshot(store_redis, victim_task)

        seen: dict[str, int] = {}

        @FUZZ
        @given(messages([victim_task, own_task]))
        def one(case: tuple[bytes, dict[str, str]]) -> None:
            send(case[0])
            replies = sentinel()
            for reply in replies:
                assert_jsonrpc(reply)
            assert "result" in replies[-1], replies[-1]
            for reply in replies[:-1]:  # the fuzz message's own reply, if it got one
                outcome = "result" if "result" in reply else str(reply["error"]["code"])
                seen[outcome] = seen.get(outcome, 0) + 1
            if len(replies) == 1:
                seen["no reply"] = seen.get("no reply", 0) + 1

        one()
        print("stdio fuzz outcomes:", dict(sorted(seen.items())))
        assert seen.get("result", 0) > EXAMPLES // 20, seen  # some examples made it through to a handler's result
        assert proc.poll() is None, "the stdio server died"
        check_victim_unchanged(fuzz_url, principals, store_redis, victim_task, before)
    finally:
        stop_group(proc)
        log.close()


# ---------------------------------------------------------------- artifact names and resource URIs

hostile_names = st.text(max_size=220) | st.sampled_from(
    ["..", ".", "../x", "..\\x", "a/../../etc/passwd", "%2e%2e", "%2F", "\x00", "a\nb", "x" * 201, "CON", " "]
)


@FUZZ
@given(hostile_names)
def test_fuzz_artifact_names_stay_one_segment_inside_the_tasks_folder(name: str) -> None:
    try:
        check_name(name)
    except ArtifactError:
        return
    assert 0 < len(name) <= 200 and name.isprintable()
    assert "/" not in name and "\\" not in name and ".." not in name
    assert parse_uri(artifact_uri("t1", name)) == ("t1", name)
    path = FsspecArtifacts("memory://fuzz-names", "fz").path("t1", name)
    assert posixpath.dirname(path) == "/fuzz-names/fz/t1" and posixpath.normpath(path) == path


@st.composite
def resource_uris(draw: st.DrawFn, task_ids: list[str]) -> str:
    """URIs a hostile client might try: other tasks, traversals, encodings, other schemes, garbage."""
    scheme = draw(st.sampled_from(["mcp-celery://tasks/", "mcp-celery://", "file:///", "", "MCP-CELERY://tasks/"]))
    task = draw(st.sampled_from(task_ids) | st.sampled_from(["..", "%2e%2e", "a%2Fb", ""]) | st.text(max_size=20))
    middle = draw(st.sampled_from(["/artifacts/", "/artifacts/../", "/output", "/", "/artifacts//"]))
    name = draw(hostile_names | st.sampled_from(["matches.jsonl", "..%2F..%2Fetc%2Fpasswd", "x?y", "x#y"]))
    return draw(mostly(st.just(f"{scheme}{task}{middle}{name}"), st.text(max_size=60)))


def test_fuzz_hostile_resource_uris_all_get_the_not_found_error(
    fuzz_url: str, principals: Principals, victim_task: str
) -> None:
    own = HttpClient(fuzz_url, principals.fuzzer)
    download = httpx.Client(timeout=30, headers={"Authorization": f"Bearer {principals.fuzzer}"})
    base = fuzz_url.removesuffix("/mcp")
    seen: dict[str, int] = {}

    @FUZZ
    @given(resource_uris([victim_task, "no-such-task"]))
    def one(uri: str) -> None:
        # A header cannot carry what HTTP strips (edge whitespace): such a URI goes without Mcp-Name.
        name = uri if uri.isascii() and uri.isprintable() and uri and uri == uri.strip() else ""
        reply = own.call("resources/read", {"uri": uri}, name=name)
        assert_jsonrpc(reply)
        assert "error" in reply, reply
        if not name and reply["error"]["code"] == -32020:  # the SDK wants Mcp-Name first: refused before any lookup
            return
        assert (reply["error"]["code"], reply["error"]["message"]) == (-32602, "Resource not found"), (uri, reply)
        parts = parse_uri(uri)
        if parts is not None:
            path = f"/artifacts/{quote(parts[0], safe='')}/{quote(parts[1], safe='')}"
            assert download.get(base + path).status_code == 404, uri
        seen["parsed" if parts else "not an artifact URI"] = (
            seen.get("parsed" if parts else "not an artifact URI", 0) + 1
        )

    one()
    for name in ("matches.jsonl", "x", "a b.txt"):  # well-formed URIs of another principal's task, for certain
        uri = artifact_uri(victim_task, name)
        reply = own.call("resources/read", {"uri": uri}, name=uri)
        assert (reply["error"]["code"], reply["error"]["message"]) == (-32602, "Resource not found"), reply
        assert download.get(f"{base}/artifacts/{victim_task}/{quote(name)}").status_code == 404
    print("resource URI fuzz:", seen)
    assert own.result("tools/list")["tools"]  # still serving
    own.close()
    download.close()
