"""The shared Celery model: what the worker and the server both know of an app and its tools.

Below the worker and the server tiers, beside the store; imports neither side, nor `mcp`. No I/O of
its own beyond what Celery does when an app is loaded.

    binding.py        AppBinding: one Celery app bound to its Redis (key names, lifetimes, durability)
    tools.py          ToolSpec: a Celery task exposed as an MCP tool (input schema, task mode), the registry,
                      and whether a job is redelivered when its worker is lost
    task_options.py   a tool's Celery options that follow the app's configuration (time limits, delivery)
    status.py         a task record -> its MCP status: the one place Celery states are compared
    calls.py          a tool call's identity: canonical JSON of its arguments and the digest that names it
    approvals.py      an approval: its URL-mode request, who may decide, the decision as an answer, `Approval`
    workflows.py      a workflow's state from its members' records, and the step it calls for
    canvas.py         what Celery is told when no worker tells it: a workflow's member headers and merge
                      launch, a parked job's REVOKED
    celery_app.py     a Celery app from `-A module[:app]`, as `celery -A` finds it
"""
