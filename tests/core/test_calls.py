"""A call's identity (`mcp_celery.core.calls`): what counts as the same call for keys, windows and policies."""

from __future__ import annotations

import doctest
import math

import pytest

from mcp_celery.core import calls
from mcp_celery.core.calls import call_digest, canonical_json


def test_the_module_examples_hold() -> None:
    failed, attempted = doctest.testmod(calls)
    assert attempted >= 3 and failed == 0


def test_key_order_and_whitespace_do_not_make_another_call() -> None:
    assert call_digest("t", {"a": 1, "b": {"y": 2, "x": [1, "z"]}}) == call_digest(
        "t", {"b": {"x": [1, "z"], "y": 2}, "a": 1}
    )


def test_another_tool_another_value_or_another_number_type_is_another_call() -> None:
    base = call_digest("t", {"n": 1})
    assert base != call_digest("u", {"n": 1})
    assert base != call_digest("t", {"n": 2})
    assert base != call_digest("t", {"n": 1.0})
    assert call_digest("t", None) == call_digest("t", {})


def test_values_json_cannot_carry_are_refused() -> None:
    with pytest.raises(ValueError):
        canonical_json({"x": math.nan})
    with pytest.raises(TypeError):
        canonical_json({"x": object()})
