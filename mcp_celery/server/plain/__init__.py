"""The fallback for hosts without the tasks extension: tasks reached through plain tool calls.

call.py        `tools/call` without the extension: the inline window, then a task handle in words
lifecycle.py   the `task_status`, `task_respond` and `task_cancel` tools
wording.py     a task in words, for a model
resume.py      the `requestState` of an MRTR round asking a running task's questions
"""
