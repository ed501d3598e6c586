"""The demo jobs as a module of their own: `celery -A jobs.demo worker`, `mcp-celery serve -A jobs.demo`.

They live inside the package (`mcp_celery/cli/demo_jobs.py`) so that `mcp-celery demo` runs from a
plain install; the `jobs` package serves them beside the real jobs too.
"""

from mcp_celery.cli.demo_jobs import app

__all__ = ["app"]
