"""A tool call's identity: its arguments in one canonical JSON form, and the digest that names a call.

Pure. Two features decide that two `tools/call` requests are "the same call": an idempotency key
reused with other arguments is refused, a dedupe window returns the earlier task, and an approval
policy binds a decision to the exact call it was asked for. All of them compare calls here, so a
call that one of them calls equal every other one does too.

The canonical form is the practical one of the JSON world (RFC 8785 is the strict one): object keys
sorted, no insignificant whitespace, UTF-8 text as is. Numbers are written as Python's `json` writes
them, so `1` and `1.0` are different calls; NaN and the infinities, which JSON cannot carry, are
refused.

    >>> canonical_json({"b": [1, 2.5], "a": "é"})
    '{"a":"é","b":[1,2.5]}'
    >>> call_digest("deploy", {"env": "prod"}) == call_digest("deploy", {"env": "prod"})
    True
    >>> call_digest("deploy", {"env": "prod"}) == call_digest("deploy", {"env": "staging"})
    False
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["call_digest", "canonical_json"]


def canonical_json(value: Any) -> str:
    """`value` as canonical JSON text (sorted keys, no whitespace).

    Raises:
        ValueError: `value` holds NaN or an infinity.
        TypeError: `value` holds something JSON cannot carry.
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def call_digest(tool: str, arguments: Mapping[str, Any] | None) -> str:
    """The SHA-256 (hex) of a call of `tool` with `arguments`; a missing `arguments` is `{}`."""
    text = canonical_json({"tool": tool, "arguments": dict(arguments or {})})
    return hashlib.sha256(text.encode()).hexdigest()
