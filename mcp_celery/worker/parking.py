"""Parking: a job whose question is still open after its park window ends its run, and the answer runs it again.

Worker tier. A job that waits for a person should hold no worker process for hours, nor die with the
next deploy. So after the tool's park window (`park_after_s=`, the `park_after_s` setting) the
question's wait ends the run with `JobParked`: `run_job` acknowledges the message and frees the
process, and the task stays `input_required`, its requests durable in the record beside the job's
own Celery message as a signature (`resume_signature`: Celery's own retry builds it the same way, so
the same task id, arguments, headers, queue and routing, priority and time limits). The answer that
closes the last open request (the ANSWER script, whichever surface it came through) sends that
message again, and the job runs from the top on any worker: every question answered before returns
its recorded answer at once, and work wrapped in `JobContext.once` is not done twice.
"""

from __future__ import annotations

from typing import Any

from kombu.utils.json import dumps

from mcp_celery.errors import JobSignal, ToolDefinitionError

__all__ = ["PARK_AFTER_ATTRIBUTE", "JobParked", "check_park_after", "park_after_s", "resume_signature"]

#: The Celery task attribute `park_after_s=` sets (absent: the setting's window).
PARK_AFTER_ATTRIBUTE = "mcp_celery_park_after_s"
#: An attribute value meaning "never parks" (`park_after_s=None`); Celery copies task options as given.
NEVER = -1.0


class JobParked(JobSignal):
    """Raised out of the job's frame when it parks: a `JobSignal`, so a job's own `except Exception:` lets it pass."""


def check_park_after(tool_name: str, value: Any) -> float:
    """The attribute value of a tool's `park_after_s=` (None: `NEVER`).

    Raises:
        ToolDefinitionError: not None nor a number of seconds >= 0.
    """
    if value is None:
        return NEVER
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ToolDefinitionError(f"tool {tool_name!r}: park_after_s must be None or a number of seconds >= 0")
    return float(value)


def park_after_s(celery_task: Any, default_s: float) -> float | None:
    """How long this tool's job waits for an answer before it parks; None: it never parks."""
    own = getattr(celery_task, PARK_AFTER_ATTRIBUTE, None)
    if own is None:
        return default_s
    return None if own < 0 else float(own)


def resume_signature(celery_task: Any) -> str:
    """The running job's own message as a Celery signature (kombu JSON), to send again on resume."""
    signature = celery_task.signature_from_request(celery_task.request)
    return dumps(dict(signature))
