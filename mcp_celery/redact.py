"""Secrets out of error text and shown values: pure, standard library only, so every tier can use it."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["HIDDEN", "hide_secrets", "redact", "secret_name"]

# scheme://user:password@  (broker and database URLs: redis://:pw@host, amqp://guest:pw@host, postgres://u:pw@h)
_URL_PASSWORD = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:/@\s]*):[^@/\s]*@")
# ...?password=secret&... (redis-py reads a password from the query too)
_QUERY_PASSWORD = re.compile(r"(?P<key>[?&;]password=)[^&\s]*")
#: A key whose name matches this holds a secret, at any depth of a shown value.
_SECRET_NAME = re.compile(r"pass|secret|token|key|credential|auth", re.IGNORECASE)
#: What a hidden value is shown as.
HIDDEN = "***"


def redact(text: str) -> str:
    """`text` with the password of every `scheme://user:password@` URL (or `?password=`) replaced by `***`.

    >>> redact("Error connecting to redis://:hunter2@db:6379/0")
    'Error connecting to redis://:***@db:6379/0'
    >>> redact("unix:///run/redis.sock?db=2&password=hunter2")
    'unix:///run/redis.sock?db=2&password=***'
    """
    text = _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)
    return _QUERY_PASSWORD.sub(lambda m: f"{m['key']}***", text)


def secret_name(name: str) -> bool:
    """Whether a key named `name` looks like it holds a secret (`db_password`, `api_key`, `authToken`)."""
    return _SECRET_NAME.search(name) is not None


def hide_secrets(value: Any) -> Any:
    """`value` (JSON-like) with the value of every secret-looking key hidden, at any depth, and URL passwords
    redacted in every string; other scalars as they are, other objects as their `repr`, redacted.

    >>> hide_secrets({"db": {"host": "h", "db_password": "pw"}, "urls": ["redis://:pw@h"], "n": 3})
    {'db': {'host': 'h', 'db_password': '***'}, 'urls': ['redis://:***@h'], 'n': 3}
    """
    if isinstance(value, Mapping):
        return {str(k): HIDDEN if secret_name(str(k)) else hide_secrets(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [hide_secrets(item) for item in value]
    if isinstance(value, str):
        return redact(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    return redact(repr(value))
