"""The startup check: connect to the store's Redis once, and say in one line what is wrong.

Tier 1 (redis-py). `mcp-celery serve` runs it before it serves, and a worker at its start: a
Redis that refuses us (a TLS certificate, a password, an ACL, a cluster older than Redis 7) is a
`ConfigurationError`, printed as `mcp-celery: ...` and never with the password, instead of a
traceback at the first request. A Redis that does not answer is `RedisUnreachable`: fatal for the
server, a warning for a worker (its jobs wait for Redis as they run).
"""

from __future__ import annotations

import ssl

import redis
import redis.cluster

from mcp_celery.errors import ConfigurationError
from mcp_celery.redact import redact
from mcp_celery.store.connect import RedisTarget, sync_client

__all__ = ["MIN_CLUSTER_VERSION", "RedisUnreachable", "describe_failure", "probe"]

#: The oldest Redis whose cluster has sharded pub/sub (SPUBLISH, SSUBSCRIBE).
MIN_CLUSTER_VERSION = (7, 0)


class RedisUnreachable(ConfigurationError):
    """`probe` found no Redis answering (refused, timed out, no master known): down, or not up yet."""


def probe(target: RedisTarget, *, timeout_s: float = 5.0) -> None:
    """Connect once and PING; on a cluster, check every primary runs Redis 7 or later.

    Raises:
        RedisUnreachable: nothing answers (a worker may start anyway and wait for it).
        ConfigurationError: Redis answers but cannot be used as configured: TLS, credentials, permissions,
            version. One line each, naming the problem and never the password.
    """
    client = sync_client(
        target, socket_timeout=timeout_s, connect_timeout=timeout_s, client_name="mcp-celery-probe", retries=0
    )
    try:
        client.ping()
        if isinstance(client, redis.cluster.RedisCluster):
            _check_cluster_version(client, target)
    except redis.RedisError as exc:
        reason, unreachable = describe_failure(exc)
        failure = RedisUnreachable if unreachable else ConfigurationError
        raise failure(f"{target.source} {target.shown}: {reason}") from None
    finally:
        client.close()


def _check_cluster_version(client: redis.cluster.RedisCluster, target: RedisTarget) -> None:
    for node in client.get_primaries():  # type: ignore[no-untyped-call]
        found = str(client.info("server", target_nodes=node).get("redis_version", "0"))
        if tuple(int(part) for part in found.split(".")[:2]) < MIN_CLUSTER_VERSION:
            raise ConfigurationError(
                f"{target.source} {target.shown}: cluster node {node.name} runs Redis {found}; "
                "a cluster store needs Redis 7 or later (its events use sharded pub/sub)"
            )


def describe_failure(exc: BaseException) -> tuple[str, bool]:
    """What went wrong connecting, in one line without secrets, and whether Redis just did not answer."""
    reason = _tls_reason(exc)
    if reason:
        return (
            f"TLS failed: {reason} (check ssl_ca_certs, ssl_certfile, ssl_keyfile and the host name in the URL "
            "against the server's certificate)",
            False,
        )
    text = redact(str(exc)).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, redis.AuthenticationError | redis.exceptions.AuthenticationWrongNumberOfArgsError):
        return f"Redis refused the credentials ({text}); check the user name and password in the URL", False
    if isinstance(exc, redis.exceptions.NoPermissionError):
        return f"the Redis user lacks a permission mcp-celery needs ({text}); see the README's ACL rule", False
    unreachable = isinstance(exc, redis.ConnectionError | redis.TimeoutError)
    return f"{'no answer from Redis' if unreachable else 'cannot use Redis'}: {text}", unreachable


def _tls_reason(exc: BaseException) -> str:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return redact(f"certificate verify failed: {seen.verify_message}")
        if isinstance(seen, ssl.SSLError):
            return redact(str(seen.reason or seen))
        seen = seen.__cause__ or seen.__context__
    text = str(exc)
    if "[SSL" in text or "SSL:" in text:
        return redact(text.split("] ", 1)[-1].split(" (_ssl", 1)[0])
    return ""
