"""The task engine: every surface reaches a task through here; no MCP wire shapes.

    service.py    TaskService: create, find (the owner check), view, answer, cancel; the server's lifespan
    repeats.py    a repeated tools/call (its idempotency key, or the tool's dedupe window) gets the earlier task
    artifacts.py  a task's artifacts read where they are kept; the sweep of expired fsspec folders
    workflow.py   a task handed over to a workflow: its view from its members', answers routed to them
    approvals.py  an approval as its page sees it: found by id, the list for a person, a decision (via answer)
    policy.py     the approval policy file (MCP_CELERY_APPROVAL_POLICY): its rules, read again on change
    gate.py       a call the policy names held for approval before its job is queued; released or "not run"
    reaper.py     the sweeps over overdue tasks: lost jobs, lost messages, parked questions timed out
    refused.py    jobs a worker refused for using another task store, read from Celery's result backend
    events.py     the process's one Redis listener: which watched tasks changed
    publish.py    queueing a job: Celery's own message, written in the record's round trip on a Redis broker
    broker.py     what a server sees of a Redis broker: where a task's message is, putting a lost one back

The reaper and the workflow read through narrow protocols (`reaper.TaskReader`, `workflow.Members`)
that the service fulfils, so neither imports the service. Below the surfaces (`tasks/`, `plain/`).
"""
