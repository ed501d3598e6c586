"""Redis clients, built in one place: a URL (and the settings) in, a sync or asyncio client out.

Tier 1 (redis-py). Every Redis client mcp-celery opens comes from here: the server's store and
event listener, the worker's stores, the publisher's broker client, the reaper's look into a Redis
broker. The URL says the topology:

    redis://[user:password@]host:port/db        one server
    rediss://...?ssl_ca_certs=CA&ssl_certfile=CERT&ssl_keyfile=KEY
                                                one server over TLS (hostname checked unless
                                                ssl_check_hostname=false; redis-py's query options)
    unix:///path/to/redis.sock?db=N             one server on a unix socket
    sentinel://[:password@]h1:p1/db;sentinel://h2:p2
                                                the master that Sentinel names (Celery's own URL;
                                                the master name comes with it, see `redis_target`)
    redis+cluster://[user:password@]host:port   a Redis Cluster, any node as the seed (store only:
    rediss+cluster://...                        Celery's broker and result backend cannot be one)

A URL is checked when it is parsed (`redis_target`), without I/O, so a bad one is one clear line at
startup; `mcp_celery.store.probe` then connects once. What the topology changes in the commands the
store sends is `mcp_celery.store.commands`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote, unquote, urlsplit

import redis
import redis.asyncio as aioredis
import redis.asyncio.cluster as aiocluster
import redis.asyncio.sentinel as aiosentinel
import redis.cluster
import redis.sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialWithJitterBackoff
from redis.connection import parse_url
from redis.exceptions import ResponseError
from redis.maint_notifications import MaintNotificationsConfig
from redis.retry import Retry

from mcp_celery.errors import ConfigurationError
from mcp_celery.redact import redact

__all__ = [
    "AsyncRedis",
    "RedisTarget",
    "SyncRedis",
    "async_client",
    "redis_target",
    "sync_client",
]

#: Either kind of synchronous client: one server (or Sentinel's master), or a cluster.
SyncRedis = redis.Redis | redis.cluster.RedisCluster
#: Either kind of asyncio client.
AsyncRedis = aioredis.Redis | aiocluster.RedisCluster

Topology = Literal["standalone", "sentinel", "cluster"]

_STANDALONE = ("redis://", "rediss://", "unix://")
_CLUSTER = {"redis+cluster://": "redis://", "rediss+cluster://": "rediss://"}
_SENTINEL = "sentinel://"

#: Retries of a command whose connection broke, with `_backoff` between them (redis-py's own defaults).
RETRIES = 10

SCHEMES_HELP = (
    "redis://host:port/db, rediss://... (TLS), unix:///path.sock, sentinel://h1:p1;sentinel://h2:p2 "
    "(with a master name) or redis+cluster://host:port"
)


@dataclass(frozen=True)
class RedisTarget:
    """A Redis as a URL described it, checked: its topology and what connecting to it takes.

    Build it with `redis_target`. `options` are redis-py connection keywords (db, username,
    password, TLS files...); for Sentinel they are the master's, `sentinel_kwargs` the sentinels'.
    """

    url: str
    topology: Topology
    options: Mapping[str, Any] = field(default_factory=lambda: {})
    sentinels: tuple[tuple[str, int], ...] = ()
    master_name: str = ""
    sentinel_kwargs: Mapping[str, Any] = field(default_factory=lambda: {})
    #: Where the URL came from, named in error messages.
    source: str = "MCP_CELERY_REDIS_URL"

    @property
    def shown(self) -> str:
        """The URL as error messages and logs may show it: without its password."""
        return redact(self.url)

    @property
    def tls(self) -> bool:
        return self.url.startswith(("rediss://", "rediss+cluster://"))

    @property
    def sharded(self) -> bool:
        """Whether events go over sharded pub/sub (a cluster: SPUBLISH and SSUBSCRIBE)."""
        return self.topology == "cluster"

    def tcp_address(self) -> tuple[Any, ...] | None:
        """(host, port, db, username, password) of one server over plain TCP; None for any other Redis."""
        if self.topology != "standalone" or not self.url.startswith("redis://"):
            return None
        return tuple(self.options.get(k) for k in ("host", "port", "db", "username", "password"))

    @classmethod
    def tcp(
        cls, host: str, port: int, db: int = 0, username: str | None = None, password: str | None = None
    ) -> RedisTarget:
        """One server over plain TCP, from its parts (a broker connection's, say)."""
        auth = ""
        if username or password:
            auth = f"{quote(username or '', safe='')}:{quote(password or '', safe='')}@"
        return redis_target(f"redis://{auth}{host}:{port}/{db}")


def redis_target(
    url: str,
    *,
    master_name: str | None = None,
    sentinel_kwargs: Mapping[str, Any] | None = None,
    setting: str = "MCP_CELERY_REDIS_URL",
) -> RedisTarget:
    """Parse and check a Redis URL (no I/O).

    Args:
        url: any of the URLs in this module's docstring.
        master_name: the Sentinel master's name (required for a sentinel:// URL).
        sentinel_kwargs: connection keywords for the sentinels themselves (Celery's transport option).
        setting: where the URL came from, named in error messages.

    Raises:
        ConfigurationError: the URL cannot work; the one line says why and what to set.
    """
    try:
        if url.startswith(_STANDALONE):
            return RedisTarget(url, "standalone", _checked_options(url), source=setting)
        for scheme, plain in _CLUSTER.items():
            if url.startswith(scheme):
                return replace(_cluster_target(url, plain + url[len(scheme) :]), source=setting)
        if url.startswith(_SENTINEL):
            return replace(_sentinel_target(url, master_name, sentinel_kwargs or {}), source=setting)
    except (ValueError, TypeError, redis.RedisError) as exc:
        raise ConfigurationError(f"{setting} {redact(url)!r} is not a usable Redis URL: {redact(str(exc))}") from None
    raise ConfigurationError(f"{setting} {redact(url)!r} is not a Redis URL: use {SCHEMES_HELP}")


def _checked_options(url: str) -> dict[str, Any]:
    """redis-py's connection keywords for `url`, with a connection object built (not connected) to check them."""
    options: dict[str, Any] = parse_url(url)  # type: ignore[no-untyped-call]
    connection_class = options.pop("connection_class", redis.Connection)
    connection_class(**options)  # unknown query options (TypeError) and bad TLS flags (RedisError) show here
    for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        if options.get(name) and not Path(options[name]).is_file():
            raise ValueError(f"{name}={options[name]} is not a file")
    return options


def _cluster_target(url: str, plain: str) -> RedisTarget:
    options = _checked_options(plain)
    if options.get("db"):
        raise ValueError(f"a cluster has database 0 only, not {options['db']}")
    return RedisTarget(url, "cluster", options)


def _sentinel_target(url: str, master_name: str | None, sentinel_kwargs: Mapping[str, Any]) -> RedisTarget:
    """Celery's sentinel URL: the sentinels' addresses; db, username and password from the first part."""
    sentinels: list[tuple[str, int]] = []
    options: dict[str, Any] = {}
    for index, part in enumerate(url.split(";")):
        part = part.strip()
        if not part.startswith(_SENTINEL):
            raise ValueError(f"each part must be sentinel://host:port, not {redact(part)!r}")
        parsed = urlsplit(part)
        if parsed.query:
            raise ValueError("query options are not supported on sentinel:// URLs (Sentinel over TLS is not)")
        sentinels.append((parsed.hostname or "localhost", parsed.port or 26379))
        if index == 0:
            path = parsed.path.strip("/")
            options = {"db": int(path) if path else 0}
            if parsed.username:
                options["username"] = unquote(parsed.username)
            if parsed.password:
                options["password"] = unquote(parsed.password)
    if not master_name:
        raise ValueError(
            "a sentinel:// URL needs the master's name: set MCP_CELERY_REDIS_MASTER_NAME, or master_name in "
            "the Celery app's result_backend_transport_options"
        )
    return RedisTarget(url, "sentinel", options, tuple(sentinels), master_name, dict(sentinel_kwargs))


# ---------------------------------------------------------------- clients


def sync_client(
    target: RedisTarget,
    *,
    socket_timeout: float | None,
    connect_timeout: float | None = 5.0,
    client_name: str | None = None,
    retries: int = RETRIES,
) -> SyncRedis:
    """A synchronous client for `target`; `socket_timeout=None` for one that blocks (BLPOP).

    Sentinel's master is looked up again on every new connection, so after a failover the next
    command reconnects to the new primary by itself. A command that finds its connection broken
    (a restarted Redis, a failed-over primary) is retried on a new one with backoff, by default
    about 5 s at most: the retries redis-py gives a client built from a host and port, and leaves
    out of one built from a URL. `retries=1` for a caller that waits out an outage in a loop of its
    own (one retry still replaces a connection a restart broke), 0 for a one-off check. One that
    times out is not retried: a Redis that hangs costs one timeout, not ten.
    """
    timeouts = _connection_options(socket_timeout, connect_timeout, client_name)
    if target.topology == "cluster":
        return redis.cluster.RedisCluster.from_url(_cluster_url(target), **timeouts)
    timeouts["retry"] = Retry(_backoff(), retries, supported_errors=(redis.ConnectionError,))
    if target.topology == "sentinel":
        sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            list(target.sentinels), sentinel_kwargs=_sentinel_kwargs(target, connect_timeout), **target.options
        )
        timeouts["connection_class"] = _SentinelConnection
        master: redis.Redis = sentinel.master_for(target.master_name, **timeouts)  # type: ignore[no-untyped-call]
        return master
    return redis.Redis.from_url(target.url, **timeouts)


def async_client(
    target: RedisTarget,
    *,
    max_connections: int | None = None,
    socket_timeout: float | None = 10.0,
    connect_timeout: float | None = 5.0,
    client_name: str | None = None,
) -> AsyncRedis:
    """An asyncio client for `target`, with at most `max_connections` connections (per node on a cluster).

    A bounded pool blocks a request that finds every connection busy until one is free, rather
    than failing it. The timeouts bound every command, so a Redis that hangs (an old primary gone
    from the network) gives an error, never a request that hangs for ever.
    """
    options = _connection_options(socket_timeout, connect_timeout, client_name)
    if target.topology == "cluster":
        if max_connections is not None:
            options["max_connections"] = max_connections
        return aiocluster.RedisCluster.from_url(_cluster_url(target), **options)
    options["retry"] = AsyncRetry(_backoff(), RETRIES, supported_errors=(redis.ConnectionError,))
    if target.topology == "sentinel":
        sentinel = aiosentinel.Sentinel(  # type: ignore[no-untyped-call]
            list(target.sentinels), sentinel_kwargs=_sentinel_kwargs(target, connect_timeout), **target.options
        )
        if max_connections is not None:
            options.update(connection_pool_class=_BlockingSentinelPool, max_connections=max_connections)
        options["connection_class"] = _AsyncSentinelConnection
        master: aioredis.Redis = sentinel.master_for(target.master_name, **options)
        return master
    if max_connections is None:
        return aioredis.Redis.from_url(target.url, **options)
    pool = aioredis.BlockingConnectionPool.from_url(target.url, max_connections=max_connections, **options)
    return aioredis.Redis(connection_pool=pool)


def _connection_options(
    socket_timeout: float | None, connect_timeout: float | None, name: str | None
) -> dict[str, Any]:
    # Nothing on a new connection beyond what the store needs: no CLIENT SETINFO (redis-py's name
    # and version, two round trips) and no CLIENT MAINT_NOTIFICATIONS (a Redis Enterprise handshake),
    # which Redis before 7.2 refuses and an ACL user without them logs as a denial every time.
    options: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
        "driver_info": None,
        "maint_notifications_config": MaintNotificationsConfig(enabled=False),
    }
    if name:
        options["client_name"] = name
    return options


def _backoff() -> ExponentialWithJitterBackoff:
    return ExponentialWithJitterBackoff(base=0.01, cap=1.0)


class _BlockingSentinelPool(aiosentinel.SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """Sentinel's pool (the master's address looked up per connection) that waits for a free connection."""


#: How Redis says a connection is not on the primary any more; inside a script's error too ("... -READONLY
#: You can't ..."): a write on a replica, a WAIT on one (a primary demoted after a failover), and a write
#: the primary refuses for want of replicas (`min-replicas-to-write`: a stalled primary that Sentinel
#: replaced while it still took writes, the split brain of a failover under load).
_NOT_PRIMARY = (
    "READONLY You can't write against a read only replica",
    "WAIT cannot be used with replica instances",
    "NOREPLICAS",
)


_LOST_PRIMARY = "the Redis this connection reached is no longer a primary that takes writes (a failover)"


def _demoted(connection: Any, exc: ResponseError) -> bool:
    return bool(connection.connection_pool.is_master) and any(sign in str(exc) for sign in _NOT_PRIMARY)


def rediscover_primary(client: SyncRedis) -> None:
    """Ask the sentinels for the primary again: idle connections to an old one are dropped (no-op without Sentinel).

    For a write that too few replicas confirmed: the connection may be on a primary that Sentinel
    replaced while it stalled, which takes writes until it is told to replicate, and then drops them.
    """
    look_up = getattr(getattr(client, "connection_pool", None), "get_master_address", None)
    if look_up is not None:
        look_up()


async def rediscover_primary_async(client: AsyncRedis) -> None:
    """`rediscover_primary` for asyncio clients."""
    look_up = getattr(getattr(client, "connection_pool", None), "get_master_address", None)
    if look_up is not None:
        await look_up()


def _not_primary(role: Any, address: Any) -> redis.ConnectionError | None:
    kind = role[0].decode() if isinstance(role[0], bytes) else str(role[0])
    return None if kind == "master" else redis.ConnectionError(f"{address} is a {kind}, not the primary (yet)")


class _SentinelConnection(redis.sentinel.SentinelManagedConnection):
    """Sentinel's connection to the primary, checked: it is one, and it stays one.

    A sentinel that has not caught up with a failover still names the old primary, which may be
    back already as an empty replica: a new connection asks ROLE (Redis's advice to Sentinel
    clients), so reads never find nothing there. redis-py drops a connection to a primary that
    became a replica when a command gets READONLY; a script's refused write comes back as a script
    error instead, and a WAIT there or a NOREPLICAS refusal is an error of its own (`_NOT_PRIMARY`), so
    those drop it too. Either way the command fails as a `ConnectionError`, and is retried on a new
    connection, which asks the sentinels again.
    """

    def connect_to(self, address: Any) -> None:
        super().connect_to(address)  # type: ignore[no-untyped-call]
        if self.connection_pool.is_master:
            self.send_command("ROLE")  # type: ignore[no-untyped-call]
            refused = _not_primary(self.read_response(), address)
            if refused:
                self.disconnect()  # type: ignore[no-untyped-call]
                raise refused

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().read_response(*args, **kwargs)
        except ResponseError as exc:
            if not _demoted(self, exc):
                raise
            self.disconnect()  # type: ignore[no-untyped-call]
            raise redis.ConnectionError(_LOST_PRIMARY) from exc


class _AsyncSentinelConnection(aiosentinel.SentinelManagedConnection):
    """`_SentinelConnection` for asyncio clients."""

    async def connect_to(self, address: Any) -> None:
        await super().connect_to(address)  # type: ignore[no-untyped-call]
        if self.connection_pool.is_master:
            await self.send_command("ROLE")
            refused = _not_primary(await self.read_response(), address)
            if refused:
                await self.disconnect()
                raise refused

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)
        except ResponseError as exc:
            if not _demoted(self, exc):
                raise
            await self.disconnect()
            raise redis.ConnectionError(_LOST_PRIMARY) from exc


def _cluster_url(target: RedisTarget) -> str:
    for scheme, plain in _CLUSTER.items():
        if target.url.startswith(scheme):
            return plain + target.url[len(scheme) :]
    raise ValueError(f"not a cluster URL: {target.shown}")


def _sentinel_kwargs(target: RedisTarget, connect_timeout: float | None) -> dict[str, Any]:
    # A sentinel that is down must not hold up the look-up of the master at the next one.
    return {**_connection_options(connect_timeout, connect_timeout, None), **target.sentinel_kwargs}
