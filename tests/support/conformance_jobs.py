"""Fixture jobs for the official MCP Tasks (SEP-2663) conformance harness and the TS tasks client.

The harness (@modelcontextprotocol/conformance@0.2.0-alpha.12) calls exactly these seven tools by
name and asserts their behaviour (see tests/support/conformance/run_suite.sh and run_ts_client.sh):

=====================  ==========  ===========================================================
tool                   task mode   behaviour
=====================  ==========  ===========================================================
greet                  forbidden   always synchronous: ``Hello, {name}!``
slow_compute           optional    sleeps ``seconds`` (cancellable); sync for non-declaring clients
failing_job            required    tool error -> task ``completed`` with ``isError: true``
protocol_error_job     required    protocol error -> task ``failed`` with ``error{code,message}``
confirm_delete         required    one elicitation inside the task (``input_required``)
multi_input            required    two elicitations outstanding at once
test_tool_with_task    required    MRTR question on ``tools/call`` first, then a task
=====================  ==========  ===========================================================

Written only against the public ``mcp_celery`` API. Run with::

    celery -A tests.support.conformance_jobs worker -P prefork -c 4 --without-gossip --without-mingle -l WARNING
    mcp-celery serve -A tests.support.conformance_jobs --http --host 127.0.0.1 --port 8765
"""

from __future__ import annotations

import os

from celery import Celery

import mcp_celery

app = Celery(
    "conformance_jobs",
    broker=os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0"),
    backend=os.environ.get("CELERY_RESULT_BACKEND", "redis://127.0.0.1:6379/1"),
)
mcp_celery.configure_app(app)
# A queue of its own, so that workers of other apps sharing the same Redis broker never receive
# (and discard as unregistered) these jobs, and this worker never takes theirs.
app.conf.task_default_queue = os.environ.get("CONFORMANCE_QUEUE", "conformance_jobs")


CONFIRM_SCHEMA = {
    "type": "object",
    "properties": {
        "confirm": {"type": "boolean", "title": "Confirm", "description": "Really do it?"},
    },
    "required": ["confirm"],
}

NAME_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "title": "Name"},
        "confirm": {"type": "boolean", "title": "Confirm"},
    },
    "required": ["name"],
}


def _accepted_content(response: dict | None) -> dict | None:
    """The ``content`` of an accepted elicitation response dict, else None."""
    if not isinstance(response, dict) or response.get("action") != "accept":
        return None
    content = response.get("content")
    return content if isinstance(content, dict) else {}


@mcp_celery.tool(app, task_mode="forbidden")
def greet(ctx: mcp_celery.JobContext, name: str) -> str:
    """Return a greeting. Always synchronous, never a task."""
    return f"Hello, {name}!"


@mcp_celery.tool(app)
def slow_compute(ctx: mcp_celery.JobContext, seconds: float, label: str = "") -> str:
    """Pretend to compute for `seconds` seconds, reporting progress; cancellable at any moment."""
    seconds = max(0.0, float(seconds))
    tag = f" {label}" if label else ""
    remaining = seconds
    while remaining > 0:
        done = seconds - remaining
        ctx.status(f"computing{tag}: {done:.0f}/{seconds:g} s")
        step = min(1.0, remaining)
        ctx.sleep(step)
        remaining -= step
    return f"Computed{tag} in {seconds:g} s"


@mcp_celery.tool(app, task_mode="required")
def failing_job(ctx: mcp_celery.JobContext) -> str:
    """Always fails with a tool error (the task ends completed with isError: true)."""
    ctx.status("about to fail")
    ctx.sleep(0.5)
    raise RuntimeError("failing_job failed on purpose")


@mcp_celery.tool(app, task_mode="required")
def protocol_error_job(ctx: mcp_celery.JobContext) -> str:
    """Always fails with a JSON-RPC protocol error (the task ends failed with error{code,message})."""
    ctx.status("about to raise a protocol error")
    ctx.sleep(0.2)
    raise mcp_celery.ProtocolError(-32603, "protocol_error_job: internal error on purpose")


@mcp_celery.tool(app, task_mode="required")
def confirm_delete(ctx: mcp_celery.JobContext, filename: str) -> str:
    """Ask for confirmation (elicitation inside the task), then 'delete' the file."""
    ctx.status(f"waiting for confirmation to delete {filename}")
    answer = ctx.elicit(f"Delete {filename}?", CONFIRM_SCHEMA)
    if answer.action == "accept" and (answer.content or {}).get("confirm") is True:
        ctx.status(f"deleting {filename}")
        return f"Deleted {filename}"
    return f"Kept {filename} (action={answer.action})"


@mcp_celery.tool(app, task_mode="required")
def multi_input(ctx: mcp_celery.JobContext) -> str:
    """Ask two questions at once (two input requests outstanding together)."""
    ctx.status("waiting for two answers")
    answers = ctx.ask(
        {
            "first": mcp_celery.elicitation("First name?", NAME_SCHEMA),
            "second": mcp_celery.elicitation("Second name?", NAME_SCHEMA),
        }
    )
    first = _accepted_content(answers.get("first"))
    second = _accepted_content(answers.get("second"))
    if first is None or second is None:
        return "Not all questions were accepted"
    return f"Got {first.get('name', '?')} and {second.get('name', '?')}"


@mcp_celery.tool(
    app,
    task_mode="required",
    ask_first={
        "user_name": mcp_celery.elicitation(
            "What is your name?",
            {
                "type": "object",
                "properties": {"name": {"type": "string", "title": "Name"}},
                "required": ["name"],
            },
        )
    },
)
def test_tool_with_task(ctx: mcp_celery.JobContext) -> str:
    """Ask the caller's name before the task starts (MRTR round), then greet them from the task."""
    content = _accepted_content(ctx.first_answers.get("user_name"))
    name = (content or {}).get("name") or "stranger"
    ctx.status(f"greeting {name}")
    return f"Hello, {name}! Your task is complete."
