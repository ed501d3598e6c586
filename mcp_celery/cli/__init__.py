"""The `mcp-celery` command (the console script and `python -m mcp_celery`); the top tier.

    command.py      the parser and `serve` (stdio or Streamable HTTP), `token`, `top` and `demo`: wiring only
    top.py          `mcp-celery top`: the deployment live in a terminal, read from Redis
    demo.py         `mcp-celery demo`: Redis, a worker and the HTTP server, then a walkthrough
    demo_jobs.py    the demo's jobs and app (`celery -A mcp_celery.cli.demo_jobs worker`)
    release_job.py  the release job: build, a named person's approval, publish (`jobs.release`; the demo's step 6)

`mcp-celery call` and `mcp-celery tasks ...` are the client's (`mcp_celery.client._cli`). `main` is
loaded lazily, so that this package alone loads nothing: each subcommand loads its tier when it runs.
"""

import importlib as _importlib
import typing as _typing

__all__ = ["main"]


def __getattr__(name: str) -> _typing.Any:
    if name != "main":
        raise AttributeError(f"module 'mcp_celery.cli' has no attribute {name!r}")
    return _importlib.import_module("mcp_celery.cli.command").main
