"""A worker's SIGTERM: running jobs get a grace period, then stop, and their tasks say why.

Worker tier, in the worker's MainProcess. Celery's warm shutdown (SIGTERM) waits for running jobs
for ever. Its soft shutdown (`worker_soft_shutdown_timeout`) belongs to the cold one (SIGQUIT, or
SIGTERM with REMAP_SIGTERM=SIGQUIT, an environment variable billiard reads on import, too late
for `configure_app`), and it sleeps its whole timeout even when every job is already done. So
mcp-celery keeps Celery's warm shutdown and adds a timer:

- when the shutdown starts, each running task's record notes why its heartbeat may stop, so the
  task reads right even if the process manager SIGKILLs the worker before the grace ends (a job
  that finishes is unaffected: its result wins);
- when MCP_CELERY_SHUTDOWN_GRACE_S has passed with jobs still running, the worker gets SIGQUIT,
  Celery's cold shutdown, which terminates them; each job's process ends its heartbeat as it
  goes (`run_job`), so the task is `failed` at once, not a heartbeat period later.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import weakref
from typing import Any

from celery import Celery
from celery.worker import state
from redis.exceptions import RedisError

from mcp_celery.core.task_options import configured
from mcp_celery.worker.config import worker_binding

__all__ = ["GRACE", "SHUT_DOWN_BEFORE_DONE", "ShutdownGrace"]

#: Why a job stopped by a worker's shutdown ended `failed`.
SHUT_DOWN_BEFORE_DONE = "the worker shut down before the job finished"

logger = logging.getLogger(__name__)


def running_task_ids() -> list[str]:
    """Ids of the jobs this worker is running (read from another thread than Celery's)."""
    while True:
        try:
            return [str(request.id) for request in list(state.active_requests)]
        except RuntimeError:  # the set changed while being copied: copy again
            continue


class ShutdownGrace:
    """The shutdown timer of the worker (if any) in this process that runs an app `configure_app` configured."""

    def __init__(self) -> None:
        self._app: weakref.ref[Celery] | None = None
        self._started = False

    def on_worker_init(self, sender: Any = None, **_: Any) -> None:
        """Celery's `worker_init`: the worker's app is ours if `configure_app` configured it."""
        app = getattr(sender, "app", None)
        self._app = weakref.ref(app) if isinstance(app, Celery) and configured(app) else None

    def on_shutting_down(self, sig: str = "", how: str = "", **_: Any) -> None:
        """Celery's `worker_shutting_down`: note why in the running tasks, and start the grace timer."""
        # Called inside Celery's signal handler: do the Redis work on a thread, not here.
        if self._app is None or self._started:
            return
        self._started = True
        threading.Thread(target=self._run, args=(how,), name="mcp-celery-shutdown", daemon=True).start()

    def _run(self, how: str) -> None:
        app = None if self._app is None else self._app()
        if app is None:
            return
        worker = worker_binding(app)
        grace = worker.settings.shutdown_grace_s
        warm = how == "Warm"
        reason = SHUT_DOWN_BEFORE_DONE + (f" (shutdown grace period {grace:g} s)" if warm else "")
        try:
            worker.store.note_lost_reason(running_task_ids(), reason)
        except (RedisError, OSError):
            logger.warning("could not note the shutdown in the running tasks' records", exc_info=True)
        if not warm:
            return  # a cold shutdown stops the jobs itself
        # The process exits (ending this daemon thread) as soon as the last job is done.
        threading.Event().wait(grace)
        left = running_task_ids()
        if left:
            logger.warning("shutdown grace period of %g s over; stopping %d job(s): %s", grace, len(left), left)
            os.kill(os.getpid(), signal.SIGQUIT)  # Celery's cold shutdown terminates the running jobs


#: The process's one shutdown timer (a process runs at most one worker), connected by `mcp_celery.worker.signals`.
GRACE = ShutdownGrace()
