"""The fallback for hosts without the tasks extension: tasks reached through plain tool calls.

call.py        `tools/call` without the extension: the inline window, then a task handle in words
windows.py     how long a call may hold its client: the inline window, below the client's own timeout
handle.py      the task handle a call answers with past its window, and its schema
lifecycle.py   the `task_status`, `task_respond` and `task_cancel` tools
wording.py     a task in words, for a model, and the same facts as structuredContent fields
resume.py      the `requestState` of an MRTR round asking a running task's questions
"""
