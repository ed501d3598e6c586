"""Production Redis topologies for the tests: TLS, Sentinel and a cluster, as real processes.

Every server binds 127.0.0.1 on a free port, runs from a folder of the test's own, and is stopped
by the pid we started. Certificates are made here with `cryptography`. The cluster and TLS need
Redis 7 (sharded pub/sub; a build with TLS): `redis7_binary()` finds one, and without one a test
skips, unless MCP_CELERY_TEST_REQUIRE names `redis7` (`.ci/run` installs Debian's and says so),
where a missing one is a failure.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from mcp_celery.testing.processes import Process, free_port, redis_answers, redis_server_binary, wait_for
from tests.support.harness import require_service

__all__ = [
    "Cluster",
    "SentinelGroup",
    "TlsFiles",
    "make_tls_files",
    "redis7_binary",
    "start_cluster",
    "start_plain",
    "start_sentinel_group",
    "start_tls_redis",
]

#: Where `.ci/run` says Redis 7 is (else the machine's redis-server binaries are tried).
REDIS7_ENV = "MCP_CELERY_TEST_REDIS7"
MASTER_NAME = "mcp-test"


def _version(binary: str) -> tuple[int, ...]:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    found = re.search(r"v=(\d+)\.(\d+)", out)
    return (int(found[1]), int(found[2])) if found else (0,)


def redis7_binary() -> str:
    """A redis-server of version 7 or later (with TLS built in); skips the test without one, outside CI."""
    candidates = [os.environ.get(REDIS7_ENV, ""), "/usr/bin/redis-server", shutil.which("redis-server") or ""]
    for binary in candidates:
        if binary and Path(binary).exists() and _version(binary) >= (7, 0):
            return binary
    require_service("redis7", f"no Redis 7 found (tried {', '.join(c for c in candidates if c)}); set {REDIS7_ENV}")
    raise AssertionError("unreachable")


def _server(binary: str, folder: Path, name: str, args: list[str], url: str) -> Process:
    folder.mkdir(parents=True, exist_ok=True)
    base = [binary, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(folder)]
    proc = Process([*base, *args], None, folder / f"{name}.log")
    try:
        proc.wait_ready(lambda: redis_answers(url), 20, f"redis-server {name}")
    except RuntimeError:
        proc.stop()
        raise
    return proc


def start_plain(
    folder: Path, name: str, *args: str, binary: str | None = None, password: str = ""
) -> tuple[int, Process]:
    """A plain redis-server (the machine's, unless `binary`), on a port a cluster bus can add 10000 to."""
    port = wait_for(lambda: (p := free_port()) <= 55535 and p, 10, 0, "a port below 55536")
    args_list = ["--port", str(port), *args] + (["--requirepass", password] if password else [])
    auth = f":{password}@" if password else ""
    return port, _server(binary or redis_server_binary(), folder, name, args_list, f"redis://{auth}127.0.0.1:{port}")


# ---------------------------------------------------------------- TLS


@dataclass(frozen=True)
class TlsFiles:
    """A CA, a server certificate for localhost (DNS name only: 127.0.0.1 fails the host name check),
    a client certificate signed by the same CA, and a second CA that signed none of them."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool,
    dns: str | None = None,
) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    issuer_name, signer = issuer if issuer else (name, key)
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if dns:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(dns)]), critical=False)
    return builder.sign(signer, hashes.SHA256())


def make_tls_files(folder: Path) -> TlsFiles:
    """Make every certificate and key a TLS test needs, in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    files = TlsFiles(*(folder / n for n in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key", "o.pem")))
    ca_key, other_key = _key(), _key()
    ca = _cert("mcp-celery test CA", ca_key, None, ca=True)
    files.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    other = _cert("some other CA", other_key, None, ca=True)
    files.other_ca.write_bytes(other.public_bytes(serialization.Encoding.PEM))
    for cert_path, key_path, subject, dns in (
        (files.server_cert, files.server_key, "localhost", "localhost"),
        (files.client_cert, files.client_key, "mcp-celery client", None),
    ):
        key = _key()
        _write_key(key, key_path)
        cert = _cert(subject, key, (ca.subject, ca_key), ca=False, dns=dns)
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return files


def start_tls_redis(folder: Path, files: TlsFiles, password: str) -> tuple[int, Process]:
    """Redis 7 over TLS only, asking clients for a certificate signed by `files.ca`, with a password."""
    binary = redis7_binary()
    port = free_port()
    args = [
        "--port", "0", "--tls-port", str(port), "--requirepass", password,
        "--tls-cert-file", str(files.server_cert), "--tls-key-file", str(files.server_key),
        "--tls-ca-cert-file", str(files.ca), "--tls-auth-clients", "yes",
    ]  # fmt: skip
    url = (
        f"rediss://:{password}@localhost:{port}/0?ssl_ca_certs={files.ca}"
        f"&ssl_certfile={files.client_cert}&ssl_keyfile={files.client_key}"
    )
    return port, _server(binary, folder, "tls", args, url)


# ---------------------------------------------------------------- Sentinel


@dataclass
class SentinelGroup:
    """A primary, a replica and three sentinels watching them under `MASTER_NAME`."""

    folder: Path
    binary: str
    data_ports: list[int]
    sentinel_ports: list[int]
    data: dict[int, Process] = field(default_factory=lambda: {})
    sentinels: list[Process] = field(default_factory=lambda: [])

    @property
    def url(self) -> str:
        """Celery's URL for the group (append `/DB` to the first part for another database)."""
        return ";".join(f"sentinel://127.0.0.1:{port}" for port in self.sentinel_ports)

    def url_for_db(self, db: int) -> str:
        first, *rest = self.sentinel_ports
        return ";".join([f"sentinel://127.0.0.1:{first}/{db}", *(f"sentinel://127.0.0.1:{p}" for p in rest)])

    def primary_port(self) -> int:
        """The port of the node the sentinels name primary now."""
        sentinel = redis.Redis(port=self.sentinel_ports[0], socket_timeout=2)
        try:
            host, port = sentinel.sentinel_get_master_addr_by_name(MASTER_NAME)
            return int(port)
        finally:
            sentinel.close()

    def start_data(self, port: int, replica_of: int | None) -> None:
        args = ["--port", str(port), "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"]
        if replica_of is not None:
            args += ["--replicaof", "127.0.0.1", str(replica_of)]
        self.data[port] = _server(
            self.binary, self.folder / str(port), f"redis-{port}", args, f"redis://127.0.0.1:{port}"
        )

    def kill(self, port: int) -> None:
        """SIGKILL a data node: whatever it had not sent its replica is gone."""
        self.data.pop(port).kill()

    def replica_online(self, primary: int) -> bool:
        """Whether `primary` has a replica in sync (one the sentinels may promote)."""
        client = redis.Redis(port=primary, socket_timeout=2)
        try:
            info = client.info("replication")  # slave0: {"ip": ..., "state": "online", ...}
        finally:
            client.close()
        return any(isinstance(v, dict) and v.get("state") == "online" for k, v in info.items() if k.startswith("slave"))

    def stall(self, port: int) -> int:
        """SIGSTOP the primary at `port` until the sentinels name another, then SIGCONT it; the new primary's port.

        The stalled node wakes up still a primary with its clients' connections open, and takes their
        writes until a sentinel tells it to replicate (some seconds later), which drops them: the split
        brain a primary that misses its pings on a loaded machine causes.
        """
        proc = self.data[port]
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            return wait_for(lambda: (p := self.primary_port()) != port and p, 30, 0.1, "the sentinels to replace it")
        finally:
            os.kill(proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        for proc in [*self.sentinels, *self.data.values()]:
            proc.stop()


def start_sentinel_group(folder: Path, *, down_after_ms: int = 1000) -> SentinelGroup:
    """Start the group and wait until every sentinel knows the primary, the replica and its peers."""
    binary = redis_server_binary()
    group = SentinelGroup(folder, binary, [free_port(), free_port()], [free_port() for _ in range(3)])
    primary, replica = group.data_ports
    group.start_data(primary, None)
    group.start_data(replica, primary)
    for port in group.sentinel_ports:
        config = folder / f"sentinel-{port}.conf"
        config.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {folder}\n"
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {primary} 2\n"
            f"sentinel down-after-milliseconds {MASTER_NAME} {down_after_ms}\n"
            f"sentinel failover-timeout {MASTER_NAME} 5000\n"
            f"sentinel parallel-syncs {MASTER_NAME} 1\n"
        )
        proc = Process([binary, str(config), "--sentinel"], None, folder / f"sentinel-{port}.log")
        group.sentinels.append(proc)
    for port in group.sentinel_ports:
        wait_for(lambda p=port: _sentinel_sees_all(p), 30, 0.1, f"sentinel {port} to see the group")  # type: ignore[misc]
    return group


def _sentinel_sees_all(port: int) -> bool:
    client = redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1)
    try:
        master = client.sentinel_master(MASTER_NAME)
        return int(master.get("num-slaves", 0)) >= 1 and int(master.get("num-other-sentinels", 0)) >= 2
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


# ---------------------------------------------------------------- cluster


@dataclass
class Cluster:
    """Three primaries, no replicas, the 16384 slots split between them."""

    ports: list[int]
    nodes: list[Process]

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.ports[0]}"

    def stop(self) -> None:
        for proc in self.nodes:
            proc.stop()


def start_cluster(folder: Path, primaries: int = 3) -> Cluster:
    """Start the nodes, give each a third of the slots and introduce them (no redis-cli needed)."""
    binary = redis7_binary()
    ports: list[int] = []
    buses: list[int] = []
    nodes: list[Process] = []
    for _ in range(primaries):
        buses.append(free_port())
        port, proc = start_plain(
            folder / f"node-{len(ports)}", f"node-{len(ports)}", "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000",
            "--cluster-port", str(buses[-1]), binary=binary,  # a bus port of its own: the default is port + 10000
        )  # fmt: skip
        ports.append(port)
        nodes.append(proc)
    clients = [redis.Redis(port=port) for port in ports]
    share = 16384 // primaries
    for index, client in enumerate(clients):
        last = 16383 if index == primaries - 1 else (index + 1) * share - 1
        client.execute_command("CLUSTER", "ADDSLOTSRANGE", index * share, last)
    for client in clients[1:]:
        client.execute_command("CLUSTER", "MEET", "127.0.0.1", ports[0], buses[0])
    wait_for(lambda: all(_cluster_ok(client, primaries) for client in clients), 30, 0.1, "the cluster to form")
    for client in clients:
        client.close()
    return Cluster(ports, nodes)


def _cluster_ok(client: redis.Redis, primaries: int) -> bool:
    info = client.execute_command("CLUSTER", "INFO")
    text = info.decode() if isinstance(info, bytes) else str(info)
    return "cluster_state:ok" in text and f"cluster_known_nodes:{primaries}" in text


def host_ip_url(url: str) -> str:
    """`url` with localhost written as 127.0.0.1 (a name the test certificate does not carry)."""
    return url.replace("localhost", str(ipaddress.ip_address("127.0.0.1")), 1)
