"""The server tier: MCP over the SDK's lowlevel `Server`, serving a Celery app's tools as tasks.

    app.py        create_server: wiring and lifespan
    creation.py   tools/call: arguments, task mode, ask_first, task or synchronous run
    handlers.py   tasks/get, tasks/update, tasks/cancel
    envelope.py   declared capabilities, Mcp-Name, the caller, the shared protocol errors
    listen.py     subscriptions/listen: notifications/tasks pushed to listeners
    service.py    the state handlers share: binding, async store, event listener
    events.py     the process's one Redis listener (task channels, coalesced pings)
    http.py       the Streamable HTTP ASGI app

Imports the worker tier's pure neighbours (store, status, tools) but never `mcp_celery.worker`:
tasks are queued by name through Celery, so the server needs no job code of its own.
"""

from mcp_celery.server.app import create_server

__all__ = ["create_server"]
