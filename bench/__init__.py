"""Benchmark harness for mcp-celery: `python -m bench [--quick]`.

Starts its own Redis, measures a raw MCP floor server, a raw ASGI ceiling
server (the load client's own limit), a raw Celery baseline, mcp-celery itself
and FastMCP + fastmcp-tasks, then prints a table and writes bench/results.md.
"""
