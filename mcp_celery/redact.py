"""Secrets out of error text: pure, standard library only, so the worker and mapping tiers can use it."""

from __future__ import annotations

import re

__all__ = ["redact"]

# scheme://user:password@  (broker and database URLs: redis://:pw@host, amqp://guest:pw@host, postgres://u:pw@h)
_URL_PASSWORD = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:/@\s]*):[^@/\s]*@")
# ...?password=secret&... (redis-py reads a password from the query too)
_QUERY_PASSWORD = re.compile(r"(?P<key>[?&;]password=)[^&\s]*")


def redact(text: str) -> str:
    """`text` with the password of every `scheme://user:password@` URL (or `?password=`) replaced by `***`.

    >>> redact("Error connecting to redis://:hunter2@db:6379/0")
    'Error connecting to redis://:***@db:6379/0'
    >>> redact("unix:///run/redis.sock?db=2&password=hunter2")
    'unix:///run/redis.sock?db=2&password=***'
    """
    text = _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)
    return _QUERY_PASSWORD.sub(lambda m: f"{m['key']}***", text)
