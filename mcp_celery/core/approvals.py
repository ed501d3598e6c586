"""Approvals: a job's question that a named person decides on mcp-celery's own web page.

Pure; shared by the worker (which asks) and the server (which checks and records the decision). An
approval travels as one input request, a URL-mode elicitation (`mode: "url"`) whose `url` is the
approval page, so a client that declared URL elicitation shows its user the link. What the server
needs to judge a decision rides along in the request's `_meta` under `APPROVAL_META`: the page's
unguessable id, who may decide, the four-eyes rule, the details and the arguments as shown. The
record holds that request like any other, so the one status table and the one answer path serve it.

The client's own answer to the elicitation (accept, decline, cancel) says only whether its user
opened the page: it decides nothing (`refusal` refuses every answer that does not come from the
page). The page answers with `decision(...)`, an `ElicitResult` whose content is the decision.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from mcp_celery.redact import hide_secrets

__all__ = [
    "APPROVAL_META",
    "Approval",
    "approval_of",
    "approval_request",
    "decision",
    "may_decide",
    "named_approvers",
    "new_approval_id",
    "page_url",
    "redacted_arguments",
    "refusal",
]

#: The `_meta` key of an approval's input request.
APPROVAL_META = "mcp-celery/approval"
#: Longer argument values are cut on the page.
_SHOWN_CHARS = 200


@dataclass(frozen=True)
class Approval:
    """A decision made on the approval page, as `JobContext.approve` returns it."""

    approved: bool
    #: The principal who decided (a token file's name, or a JWT's subject).
    by: str
    at: datetime
    comment: str = ""

    @classmethod
    def from_answer(cls, answer: Mapping[str, Any]) -> Approval:
        content = answer.get("content") or {}
        return cls(
            approved=bool(content.get("approved")),
            by=str(content.get("by", "")),
            at=datetime.fromtimestamp(int(content.get("at", 0)) / 1000, UTC),
            comment=str(content.get("comment") or ""),
        )

    def __str__(self) -> str:
        said = f": {self.comment}" if self.comment else ""
        return f"{'approved' if self.approved else 'denied'} by {self.by}{said}"


def new_approval_id() -> str:
    """An unguessable id (192 random bits); it grants nothing without signing in."""
    return secrets.token_urlsafe(24)


def page_url(public_url: str, approval_id: str) -> str:
    """The approval page's URL, beside the MCP endpoint: `https://host/mcp` -> `https://host/approvals/ID`.

    >>> page_url("https://jobs.example/mcp", "abc")
    'https://jobs.example/approvals/abc'
    >>> page_url("http://127.0.0.1:8000/team/mcp/", "abc")
    'http://127.0.0.1:8000/team/approvals/abc'
    """
    parts = urlsplit(public_url)
    path = parts.path.rstrip("/")
    if path.endswith("/mcp") or path == "/mcp":
        path = path[: -len("/mcp")]
    return urlunsplit((parts.scheme, parts.netloc, f"{path}/approvals/{approval_id}", "", ""))


def redacted_arguments(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments as the page shows them: the values of secret-looking names hidden at any depth
    (`{"config": {"db_password": ...}}`), URL passwords redacted, long strings cut."""
    return {name: _cut(value) for name, value in hide_secrets(arguments).items()}


def _cut(value: Any) -> Any:
    if isinstance(value, dict):
        return {name: _cut(item) for name, item in value.items()}
    if isinstance(value, list):
        return [_cut(item) for item in value]
    if isinstance(value, str) and len(value) > _SHOWN_CHARS:
        return value[:_SHOWN_CHARS] + "…"
    return value


def named_approvers(approvers: Sequence[str] | None) -> list[str] | None:
    """`approvers` as the request keeps them (sorted, once each); None stays None: anyone signed in.

    Raises:
        TypeError: a `str` (`approvers="bob"` would name "b" and "o"), or not a sequence of principal names.
        ValueError: an empty sequence, which would name nobody.
    """
    if approvers is None:
        return None
    if isinstance(approvers, str | bytes) or not isinstance(approvers, Sequence | Set):
        raise TypeError(
            f"approvers must be a list of principal names, e.g. approvers=[{approvers!r}], not {approvers!r}"
        )
    if not all(isinstance(name, str) and name for name in approvers):
        raise TypeError(f"approvers must be non-empty principal names (str), not {list(approvers)!r}")
    if not approvers:
        raise ValueError("approvers=[] names nobody who could decide: name principals, or pass None for anyone")
    return sorted(set(approvers))


def approval_request(
    message: str,
    url: str,
    *,
    approval_id: str,
    approvers: Sequence[str] | None,
    four_eyes: bool,
    details: Mapping[str, Any] | None,
    arguments: Mapping[str, Any],
    requester: str,
) -> dict[str, Any]:
    """The input request of an approval: a URL-mode elicitation carrying the approval in its `_meta`.

    Raises:
        TypeError, ValueError: `approvers` is not a list of principal names (`named_approvers`).
    """
    approval = {
        "id": approval_id,
        "approvers": named_approvers(approvers),
        "fourEyes": four_eyes,
        "details": hide_secrets(dict(details or {})),
        "arguments": dict(arguments),
        "requester": requester,
    }
    return {
        "method": "elicitation/create",
        "params": {"mode": "url", "message": message, "url": url, "_meta": {APPROVAL_META: approval}},
    }


def approval_of(request: Mapping[str, Any]) -> dict[str, Any] | None:
    """The approval an input request carries, or None for any other request."""
    params = request.get("params")
    if request.get("method") != "elicitation/create" or not isinstance(params, Mapping):
        return None
    meta = params.get("_meta")
    found = meta.get(APPROVAL_META) if isinstance(meta, Mapping) else None
    return dict(found) if isinstance(found, Mapping) else None


def may_decide(approval: Mapping[str, Any], principal: str) -> str | None:
    """Why `principal` may not decide `approval`, or None when they may."""
    if not principal:
        return "only a signed-in person may decide an approval"
    # Only an explicit `four_eyes=False` lets the requester decide: a request without the key is four-eyes too.
    if approval.get("fourEyes") is not False and principal == approval.get("requester"):
        return "four eyes: the person who asked may not approve their own request"
    approvers = approval.get("approvers")
    if approvers is not None and principal not in approvers:
        return "you are not one of the approvers this request names"
    return None


def refusal(request: Mapping[str, Any], answer: Any, decided_by: str | None) -> str | None:
    """Why `answer` may not answer `request` as an approval decision by `decided_by`, or None.

    Every request that is not an approval refuses a decision; an approval refuses every answer but a
    decision from its page (`decided_by` is the signed-in principal there; None: any other surface).
    """
    approval = approval_of(request)
    if approval is None:
        return None if decided_by is None else "not an approval: answer it where it was asked"
    if decided_by is None:
        return "an approval is decided on its page, not by the client's answer"
    if why := may_decide(approval, decided_by):
        return why
    content = answer.get("content") if isinstance(answer, Mapping) else None
    if not isinstance(content, Mapping) or content.get("by") != decided_by or answer.get("action") != "accept":
        return "not a decision by the signed-in person"
    return None


def decision(*, approved: bool, by: str, at_ms: int, comment: str) -> dict[str, Any]:
    """The answer the page gives an approval's request (an `ElicitResult`)."""
    return {"action": "accept", "content": {"approved": approved, "by": by, "at": at_ms, "comment": comment}}
