"""`kill -USR1 PID` on a server process logs what it holds: how operators (and the tests) see leaks.

Server tier, beside the task service (which runs `report_on_signal` through its lifespan).
"""

from __future__ import annotations

import asyncio
import logging
import signal

import anyio

from mcp_celery.server.engine.events import TaskEvents

__all__ = ["diagnostics", "report_on_signal"]

logger = logging.getLogger(__name__)


async def report_on_signal(events: TaskEvents) -> None:
    """Log `diagnostics` on every SIGUSR1, until cancelled."""
    with anyio.open_signal_receiver(signal.SIGUSR1) as signals:
        async for _ in signals:
            logger.warning("mcp-celery diagnostics: %s", " ".join(f"{k}={v}" for k, v in diagnostics(events).items()))


def diagnostics(events: TaskEvents) -> dict[str, int]:
    """Counts that must return to where they were once clients go away."""
    return {"asyncio_tasks": len(asyncio.all_tasks()), "watched_channels": events.channels, "watchers": events.watchers}
