"""The server tier: MCP over the SDK's lowlevel `Server`, serving a Celery app's tools as tasks.

    app.py       create_server: wiring and lifespan
    http.py      the Streamable HTTP ASGI app (`mcp-celery serve --http`): wiring only
    resources.py resources/read: a task's artifacts as MCP resources
    downloads.py GET /artifacts/{taskId}/{name}: an artifact streamed over HTTP, with Range requests
    engine/      the task engine: create, find, answer, cancel; the reaper, events, publishing
    tasks/       the SEP-2663 surface: tools/call, tasks/get|update|cancel, subscriptions/listen
    plain/       the fallback for hosts without the extension: plain calls and the task_* tools
    approvals/   the approval page under /approvals: sign-in, the list, Approve / Deny
    edge/        auth and tokens, request limits and quotas, HTTP refusals
    ops/         metrics, deployment figures, probes, operator routes, diagnostics, observation

The surfaces translate shapes over the engine; the engine, the edge and ops never import a surface
(`tests/package/test_layering.py`). Imports the shared model (`mcp_celery.core`) and the store but never
`mcp_celery.worker`: tasks are queued by name through Celery, so the server needs no job code.
"""

from mcp_celery.server.app import create_server

__all__ = ["create_server"]
