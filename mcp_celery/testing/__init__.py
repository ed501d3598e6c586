"""Helpers for tests of mcp-celery and of code that uses it (as `celery.contrib.testing`).

    processes.py    processes and Redis for a test: start, wait for a line or a port, stop; a private Redis
    jsonrpc.py      raw JSON-RPC clients for the 2026-07-28 wire, over Streamable HTTP and stdio
    approvals.py    the approval page driven as a browser without JavaScript: sign in, decide
    oidc_provider.py  a real OpenID Connect provider on loopback (PKCE enforced; bad ID tokens on request)

Used by `mcp-celery demo`, the test suite and the benchmark; nothing below the commands imports it.
"""
