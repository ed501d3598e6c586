"""The release job as a module of `jobs`: `jobs.release.register(app)` adds the `release` tool to an app.

It lives inside the package (`mcp_celery/cli/release_job.py`) so that `mcp-celery demo` runs it
from a plain install, as the demo's step 6.
"""

from mcp_celery.cli.release_job import ReleaseReport, build, register

__all__ = ["ReleaseReport", "build", "register"]
