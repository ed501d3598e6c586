"""The client tier: a client library for SEP-2663 servers (this one or any other).

Imports `mcp` only, never celery or redis; `tests/test_layering.py` holds it to that.
"""

__all__: list[str] = []
