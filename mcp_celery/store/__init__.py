"""The store: mcp-celery's own task state in Redis.

`schema` (key names, field names, the record codec, the lifetime policy) and `scripts` (Lua)
are pure and shared; `sync.SyncStore` is the worker's shell and `aio.AsyncStore` the server's,
each built with its lifetimes once, so callers never pass expiries around. Both shells queue
the same commands and decode with the same codec, so the two sides cannot drift.

    schema.py        key names, hash fields, the record codec, lifetimes and durability
    scripts.py       the Lua scripts behind every atomic multi-key change
    commands.py      what the Redis topology changes in the commands sent
    connect.py       Redis clients from a URL and the settings, sync or asyncio
    sync.py          the worker's store; sync_waits.py its waiting loops, sync_members.py workflows,
                     sync_artifacts.py artifacts, sync_output.py the live output
    artifacts.py     artifact names, URIs and meta
    artifact_files.py  artifacts in a file system or object store: the layout, the sweep's marker
    output.py        a task's live output: what is kept, and how a reader sees it
    aio.py           the server's store; gated.py what a call the approval policy holds adds to it
    replication.py   the WAIT behind a write that must outlive a failover
    retry.py         how the worker's store waits out a Redis away for a moment
    ended.py         the stream of ended tasks, for the deployment's figures
    deployment.py    the whole deployment at one moment, for `top` and the figures
    probe.py         the start-up check of the store's Redis
    acl.py           the least-privilege ACL rule for mcp-celery's Redis user
"""

from mcp_celery.store.schema import FIELD, INPUT_FIELD_PREFIX, Keys, Lifetimes, TaskRecord

__all__ = ["FIELD", "INPUT_FIELD_PREFIX", "Keys", "Lifetimes", "TaskRecord"]
