"""`mcp-celery top`: a live terminal view of the deployment, read from Redis directly (no server).

Reads a `DeploymentSnapshot` (`mcp_celery.store.deployment`) every interval: tasks running and
waiting for input by tool (as the live workers' beats say), how many are parked, the oldest waiting
for input (in a worker process or parked), the
broker's queue depths, the workers with a live heartbeat, and the latest endings and failures
with their reasons (from the ended stream; a Redis Cluster store keeps none, and the view says
so). `render` is pure; `run_top` draws frames on the terminal's alternate screen until Ctrl-C or q.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import termios
import tty
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TextIO

from celery import Celery

from mcp_celery.core.binding import AppBinding
from mcp_celery.core.tools import registry
from mcp_celery.protocol import now_ms
from mcp_celery.server.engine.broker import RedisBroker
from mcp_celery.server.ops.deployment_metrics import broker_queues
from mcp_celery.settings import Settings
from mcp_celery.store.connect import async_client
from mcp_celery.store.deployment import RECENT, DeploymentReader, DeploymentSnapshot

__all__ = ["NO_STREAM", "reader_for", "render", "run_top"]

#: What the view says in place of the endings on a Redis Cluster store.
NO_STREAM = "ended tasks and failures: not kept on a Redis Cluster store (no ended stream there)"

_CLEAR, _ALT_ON, _ALT_OFF = "\x1b[H\x1b[2J", "\x1b[?1049h\x1b[?25l", "\x1b[?25h\x1b[?1049l"


def reader_for(app: Celery, settings: Settings) -> DeploymentReader:
    """A reader of the app's deployment: its store, and its Redis broker's queues of the app's tools."""
    binding = AppBinding.create(app, settings)
    client = async_client(binding.redis, client_name="mcp-celery-top")
    tasks = [spec.celery_task for spec in registry(app).values()]
    return DeploymentReader(client, binding.keys, broker_queues(tasks, RedisBroker.of_app(app)))


def render(snapshot: DeploymentSnapshot, *, title: str = "mcp-celery top", width: int = 100) -> str:
    """One frame of the view, as text."""
    at = datetime.fromtimestamp(snapshot.at_ms / 1000, UTC).strftime("%H:%M:%S UTC")
    lines = [f"{title} - {at}", ""]
    lines += _tasks_now(snapshot)
    lines += _waiting(snapshot)
    lines += _queues(snapshot)
    lines += _workers(snapshot)
    lines += _ended(snapshot)
    return "\n".join(line[:width] for line in lines)


def _tasks_now(snapshot: DeploymentSnapshot) -> list[str]:
    now = snapshot.tasks_now()
    tools = sorted({tool for _, tool in now})
    lines = [f"TASKS NOW  working {sum(n for (s, _), n in now.items() if s == 'working')}"
             f"  input_required {sum(n for (s, _), n in now.items() if s == 'input_required')}"
             f"  parked (no worker) {snapshot.parked}"
             f"  unfinished (watched) {snapshot.unfinished}"]  # fmt: skip
    lines.append(f"  {'TOOL':<28} {'WORKING':>8} {'INPUT':>8}")
    lines += [f"  {tool:<28} {now[('working', tool)]:>8} {now[('input_required', tool)]:>8}" for tool in tools]
    return [*lines, ""]


def _waiting(snapshot: DeploymentSnapshot) -> list[str]:
    lines = ["OLDEST WAITING FOR INPUT", f"  {'TASK':<40} {'TOOL':<24} {'WAITING':>9}  WHERE"]
    for job in snapshot.oldest_waiting(10):
        waited = (snapshot.at_ms - (job.input_since_ms or snapshot.at_ms)) / 1000
        where = "parked, no worker" if snapshot.is_parked(job) else "in a worker"
        lines.append(f"  {job.task_id:<40} {job.tool:<24} {waited:>8.0f}s  {where}")
    return [*lines, ""]


def _queues(snapshot: DeploymentSnapshot) -> list[str]:
    if snapshot.unacked is None:
        return ["QUEUES  (not a Redis broker: depths unknown)", ""]
    lines = [f"QUEUES  unacked {snapshot.unacked}", f"  {'QUEUE':<28} {'DEPTH':>8}"]
    lines += [f"  {queue:<28} {depth:>8}" for queue, depth in sorted(snapshot.queue_depths.items())]
    return [*lines, ""]


def _workers(snapshot: DeploymentSnapshot) -> list[str]:
    lines = [f"WORKERS  {len(snapshot.workers)} live", f"  {'PROCESS':<32} {'NODE':<32} {'JOBS':>5} {'BEAT':>6}"]
    for worker in sorted(snapshot.workers, key=lambda w: w.worker_id):
        ago = max(snapshot.at_ms - worker.beat_ms, 0) / 1000
        lines.append(f"  {worker.worker_id:<32} {worker.node:<32} {len(worker.jobs):>5} {ago:>5.0f}s")
    return [*lines, ""]


def _ended(snapshot: DeploymentSnapshot) -> list[str]:
    if snapshot.recent is None:
        return [NO_STREAM]
    ended = snapshot.recent_ended()
    lines = [f"ENDED  (the latest {len(snapshot.recent)})", f"  {'TOOL':<28} {'STATUS':<12} {'COUNT':>6}"]
    lines += [f"  {tool:<28} {status:<12} {n:>6}" for (tool, status), n in sorted(ended.items())]
    lines += ["", "RECENT FAILURES", f"  {'ENDED':<10} {'TOOL':<20} {'TASK':<24} REASON"]
    for entry in snapshot.recent_failures(10):
        at = datetime.fromtimestamp(entry.ended_ms / 1000, UTC).strftime("%H:%M:%S")
        reason = " ".join(entry.reason.split())
        lines.append(f"  {at:<10} {entry.tool:<20} {entry.task_id[:24]:<24} {reason}")
    return lines


async def run_top(reader: DeploymentReader, *, interval_s: float, once: bool, out: TextIO = sys.stdout) -> None:
    """Draw frames every `interval_s` until Ctrl-C or q (`once`: print one frame and return)."""
    width = _width(out)
    if once:
        out.write(render(await reader.snapshot(now_ms(), RECENT), width=width) + "\n")
        out.flush()
        return
    quit_pressed = asyncio.Event()
    with _screen(out), _keys(quit_pressed):
        while not quit_pressed.is_set():
            frame = render(await reader.snapshot(now_ms(), RECENT), width=_width(out))
            out.write(_CLEAR + frame.replace("\n", "\r\n") + "\r\n\r\n  q: quit")
            out.flush()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(quit_pressed.wait(), interval_s)


def _width(out: TextIO) -> int:
    try:
        return os.get_terminal_size(out.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return 120


@contextlib.contextmanager
def _screen(out: TextIO) -> Iterator[None]:
    out.write(_ALT_ON)
    try:
        yield
    finally:
        out.write(_ALT_OFF)
        out.flush()


@contextlib.contextmanager
def _keys(quit_pressed: asyncio.Event) -> Iterator[None]:
    """Single keys from a terminal's stdin (cbreak mode, restored after); q sets `quit_pressed`."""
    if not sys.stdin.isatty():
        yield
        return
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    loop = asyncio.get_running_loop()

    def key() -> None:
        if os.read(fd, 1) in (b"q", b"Q"):
            quit_pressed.set()

    tty.setcbreak(fd)
    loop.add_reader(fd, key)
    try:
        yield
    finally:
        loop.remove_reader(fd)
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
