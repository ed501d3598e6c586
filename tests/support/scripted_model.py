"""A scripted model for `mcp-celery call --sampling-command`: a sampling request as JSON on stdin, the result on stdout.

Deterministic, so a test knows every turn: while the conversation holds no tool result it asks to
read `pkg/util.py`; then it submits a review with one finding on the line of that file's broad
except, found in the tool result it was given. Run as `python tests/support/scripted_model.py`.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

MODEL = "scripted-command"


def answer(request: dict[str, Any]) -> dict[str, Any]:
    params = request["params"]
    results = [
        block
        for message in params["messages"]
        for block in (message["content"] if isinstance(message["content"], list) else [message["content"]])
        if block["type"] == "tool_result"
    ]
    if not results:
        use = {"type": "tool_use", "id": "read-1", "name": "read", "input": {"file": "pkg/util.py"}}
        return {"role": "assistant", "model": MODEL, "stopReason": "toolUse", "content": [use]}
    text = results[-1]["content"][0]["text"]
    line = next(int(m.group(1)) for m in re.finditer(r"^\s*(\d+)\t.*except Exception", text, re.MULTILINE))
    finding = {"file": "pkg/util.py", "line": line, "rule": "no-broad-except", "severity": "warning",
               "message": "the broad except hides the real error", "suggestion": "catch OSError"}  # fmt: skip
    submit = {"type": "tool_use", "id": "submit-1", "name": "submit_review",
              "input": {"summary": "One broad except to narrow.", "findings": [finding]}}  # fmt: skip
    return {"role": "assistant", "model": MODEL, "stopReason": "toolUse", "content": [submit]}


if __name__ == "__main__":
    json.dump(answer(json.load(sys.stdin)), sys.stdout)
