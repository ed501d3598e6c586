"""Helpers for tests of mcp-celery and of code that uses it (as `celery.contrib.testing`).

    processes.py    processes and Redis for a test: start, wait for a line or a port, stop; a private Redis
    jsonrpc.py      raw JSON-RPC clients for the 2026-07-28 wire, over Streamable HTTP and stdio

Used by `mcp-celery demo`, the test suite and the benchmark; nothing below the commands imports it.
"""
