"""The least-privilege Redis ACL rule for mcp-celery's own user (the README prints it; the tests run with it).

Pure. The rule allows mcp-celery's keys and event channels only (its key prefix) and the commands
its servers and workers send, directly or from the Lua scripts, nothing else: no FLUSH, no KEYS,
no CONFIG, no other keys. Celery's broker and result backend are Celery's and keep their own user.

>>> acl_rule("mcp-celery").split()[:3]
['resetkeys', '~mcp-celery:*', 'resetchannels']
"""

from __future__ import annotations

__all__ = ["CLUSTER_COMMANDS", "COMMANDS", "acl_rule"]

#: Everything a server, a worker and the scripts send to a Redis server or Sentinel's master.
COMMANDS = (
    # connecting (AUTH is always allowed; the connection's name; a database other than 0)
    "ping", "select", "client|setname",
    # the task hash, the answers hash, the bell, the live and owner sets, the state secret
    "exists", "del", "expire", "persist", "get", "set",
    "hset", "hsetnx", "hget", "hmget", "hgetall", "hdel", "hexists", "hincrby",
    "lpush", "blpop", "zadd", "zrem", "zrange", "zrangebyscore",
    # the scripts (loaded on a node that lacks them), their events, MCP_CELERY_REDIS_MIN_REPLICAS
    "evalsha", "script|load", "publish", "subscribe", "unsubscribe", "wait",
    # Sentinel: a new connection checks that it reached the primary
    "role",
    # the deployment's figures: the ended stream and its consumer group, the workers' beats, the
    # reporting replica's lease (mcp_celery.store.deployment, mcp_celery.server.ops.deployment_metrics)
    "xadd", "xrevrange", "xreadgroup", "xgroup|create", "zcard", "zremrangebyscore", "pexpire",
    # artifacts in Redis (their lifetime follows the record's; ranged reads), parked answers (ANSWER
    # looks for open requests), the approval page's sign-in attempts (a success is taken back; redis-py's
    # incr and decr send INCRBY and DECRBY)
    "pttl", "hkeys", "getrange", "incrby", "decrby",
    # a task's live output (ctx.output); an artifact streamed into Redis in pieces, then renamed whole
    "append", "rename",
    # the approval page's OpenID Connect sign-in attempts, each taken once
    "getdel",
)  # fmt: skip

#: Added on a cluster: sharded events, and what the cluster client asks to learn the slots.
CLUSTER_COMMANDS = ("spublish", "ssubscribe", "sunsubscribe", "cluster|slots", "cluster|shards", "command", "info")


def acl_rule(prefix: str = "mcp-celery", *, cluster: bool = False) -> str:
    """The ACL SETUSER rule (after `on >password`) for a user that serves mcp-celery under `prefix`.

    Args:
        prefix: MCP_CELERY_KEY_PREFIX.
        cluster: add what a Redis Cluster store needs.
    """
    commands = COMMANDS + (CLUSTER_COMMANDS if cluster else ())
    return " ".join([f"resetkeys ~{prefix}:*", f"resetchannels &{prefix}:*", "-@all", *(f"+{c}" for c in commands)])
