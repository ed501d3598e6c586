"""Idempotency keys on the wire: where a `tools/call` carries one, and how a server says it honours them.

Tier 0, standard library only; the server (`mcp_celery.server.engine.repeats`) and the client
(`mcp_celery.client._retries`) both read it (issue 47). MCP has no idempotency key of its own (the
proposal for one was closed), so mcp-celery takes the HTTP world's: the IETF draft "The Idempotency-Key
HTTP Header Field". A client chooses a fresh key per call; a call sent again with the same key gets the
first call's task, and the job runs once; the key with another call is refused.

    >>> header_value('"8e03978e-40d5"') == header_value("8e03978e-40d5") == "8e03978e-40d5"
    True
"""

from __future__ import annotations

import uuid

__all__ = ["HEADER", "META", "SERVER_EXTENSION", "header_value", "new_key"]

#: The key in a `tools/call`'s `params._meta`: any transport, stdio included.
META = "mcp-celery/idempotencyKey"
#: The key as an HTTP header (Streamable HTTP), the draft's name.
HEADER = "Idempotency-Key"
#: The server capability (under `capabilities.extensions`) that says a server honours keys: only then
#: may a client send a call again when its reply is lost. Its settings name where the key goes.
SERVER_EXTENSION = "mcp-celery/idempotency"


def new_key() -> str:
    """A fresh key for one call: a random UUID."""
    return str(uuid.uuid4())


def header_value(value: str) -> str:
    """The key a header value names: as it is, or the draft's structured-field string (`"..."`) unquoted."""
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return value
