"""The demo app under the name the guides use (`celery -A mcp_celery.demo_jobs worker`); it lives in
`mcp_celery.cli.demo_jobs`, beside the `mcp-celery demo` command that runs it."""

from mcp_celery.cli.demo_jobs import TrainingReport, app, register

__all__ = ["TrainingReport", "app", "register"]
