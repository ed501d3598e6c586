"""The SEP-2663 tasks surface: the extension's methods over the task engine; shapes only.

creation.py   `tools/call`: arguments, the task mode, `ask_first`, then a task or a plain call
handlers.py   `tasks/get`, `tasks/update`, `tasks/cancel`
listen.py     `subscriptions/listen`: `notifications/tasks` and the outputs' updates pushed to the client
pacing.py     at most 4 output updates a second per URI
envelope.py   what a request's envelope says: declared capabilities, Mcp-Name, the caller
"""
