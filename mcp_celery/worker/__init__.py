"""The worker tier: what job code and Celery workers use.

    decorators.py    `tool` and `expose`: functions and Celery tasks made MCP tools (checked at import)
    context.py       JobContext: status, questions, cancel checks, `once`, workflows, from inside a job
    execution.py     running one job: the code around every tool's Celery task body
    outcome.py       a job's outcome in the shape of Celery's result meta
    artifacts.py     `JobContext.artifact`: files handed over beside the result
    output.py        `JobContext.output`: the live output a job prints as it runs
    heartbeat.py     the heartbeat of running jobs
    parking.py       a job whose question stays open ends its run; the answer runs it again
    approvals.py     `ctx.approve`'s request, its page index entry and the webhook POST
    taken.py         the `taken` mark from the ack until the job starts
    workflow.py      a job handing its task over to a Celery canvas; members reporting back
    config.py        `configure_app`, the settings it applies, the start-up checks, WorkerBinding
    serializers.py   what the JSON-only setting breaks in an app that used pickle
    shutdown.py      SIGTERM: the shutdown grace period
    logsetup.py      JSON log lines with each job's task fields
    signals.py       every Celery signal hookup, connected by one call (`signals.connect`, below)

Imports celery and redis, never `mcp` (the SDK package loads its server and client on import);
`tests/package/test_layering.py` holds it to that.
"""

from mcp_celery.worker import signals
from mcp_celery.worker.config import configure_app
from mcp_celery.worker.context import JobContext, current_context
from mcp_celery.worker.decorators import expose, tool

__all__ = ["JobContext", "configure_app", "current_context", "expose", "tool"]

signals.connect()  # the one place the worker tier hooks into Celery's signals
