"""The store: mcp-celery's own task state in Redis.

`schema` (key names, field names, the record codec, the lifetime policy) and `scripts` (Lua)
are pure and shared; `sync.SyncStore` is the worker's shell and `aio.AsyncStore` the server's,
each built with its lifetimes once, so callers never pass expiries around. Both shells queue
the same commands and decode with the same codec, so the two sides cannot drift.
"""

from mcp_celery.store.schema import FIELD, INPUT_FIELD_PREFIX, Keys, Lifetimes, TaskRecord

__all__ = ["FIELD", "INPUT_FIELD_PREFIX", "Keys", "Lifetimes", "TaskRecord"]
