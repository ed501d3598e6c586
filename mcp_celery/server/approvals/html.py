"""The approval page's HTML: plain server-rendered pages, one stylesheet, no script.

Server tier, the approval page's own; pure (strings in, strings out). Every value is escaped; the
pages load nothing but `style.css` from the same origin, which the Content-Security-Policy of
`pages.py` holds them to. Sized for a phone first (one column, large buttons).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape
from typing import Any

from mcp_celery.server.engine.approvals import ApprovalState

__all__ = ["STYLE", "SignInLink", "approval_page", "forward_page", "list_page", "message_page", "sign_in_page"]

STYLE = """\
*{box-sizing:border-box}
body{margin:0;font:16px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d2330;background:#f4f5f7}
header{display:flex;justify-content:space-between;align-items:center;padding:.6rem 1rem;background:#1d2330;color:#fff}
header a{color:#fff}header form{margin:0}
main{max-width:42rem;margin:0 auto;padding:1rem}
h1{font-size:1.35rem;margin:.4rem 0 1rem}
.card{background:#fff;border:1px solid #d8dbe2;border-radius:.5rem;padding:1rem;margin:0 0 1rem}
.message{font-size:1.1rem;font-weight:600;margin:0 0 .75rem}
dl{display:grid;grid-template-columns:max-content minmax(0,1fr);gap:.25rem .75rem;margin:0}
dt{color:#5b6270}dd{margin:0;overflow-wrap:anywhere}
pre{margin:0;padding:.5rem;background:#f4f5f7;border-radius:.25rem;white-space:pre-wrap;overflow-wrap:anywhere;font-size:.85rem}
label{display:block;font-weight:600;margin:.5rem 0 .25rem}
input[type=password],textarea{width:100%;padding:.6rem;font:inherit;border:1px solid #b9bfcb;border-radius:.35rem}
textarea{min-height:5rem}
.buttons{display:flex;gap:.75rem;margin-top:.75rem}
a.button{display:block;text-align:center;text-decoration:none;padding:.8rem 1rem;font-weight:600;border-radius:.4rem}
button{flex:1;padding:.8rem 1rem;font:inherit;font-weight:600;border:0;border-radius:.4rem;cursor:pointer}
.approve{background:#1a7f37;color:#fff}.deny{background:#b42318;color:#fff}
.plain{background:#e5e7eb;color:#1d2330;flex:0}
.note{padding:.75rem 1rem;border-radius:.4rem;background:#fff4e5;border:1px solid #f0c36d}
.ok{background:#e8f5ec;border-color:#8fd19e}.bad{background:#fdecec;border-color:#f1a7a7}
ul.list{list-style:none;padding:0}ul.list li{margin:0 0 .75rem}
small{color:#5b6270}
"""


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M UTC") if ms else "unknown"


def _layout(title: str, body: str, *, principal: str | None = None, sign_out_csrf: str = "", head: str = "") -> str:
    account = ""
    if principal is not None:
        account = (
            f'<form method="post" action="/approvals/sign-out"><input type="hidden" name="csrf" '
            f'value="{escape(sign_out_csrf)}"><small>{escape(principal)}</small> '
            '<button class="plain" type="submit">Sign out</button></form>'
        )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f'<title>{escape(title)} · mcp-celery</title><link rel="stylesheet" href="/approvals/style.css">{head}</head>'
        f'<body><header><a href="/approvals">Approvals</a>{account}</header><main>{body}</main></body></html>'
    )


def sign_in_page(
    csrf: str, next_path: str, error: str = "", *, provider: SignInLink | None = None, token_form: bool = True
) -> str:
    """The sign-in page: "Sign in with <provider>" when OpenID Connect is configured, and the form for the
    approver's own mcp-celery token or JWT (posted once, never shown again) unless `token_form` is off."""
    note = f'<p class="note bad">{escape(error)}</p>' if error else ""
    body = f"<h1>Sign in to decide approvals</h1>{note}"
    if provider is not None:
        body += _provider_button(provider)
    if token_form:
        body += _token_form(csrf, next_path, or_else=provider is not None)
    return _layout("Sign in", body)


@dataclass(frozen=True)
class SignInLink:
    """The provider's button: its name, where the page starts the sign-in, or why it cannot now."""

    name: str
    href: str
    unavailable: str = ""


def _provider_button(provider: SignInLink) -> str:
    if provider.unavailable:
        return f'<p class="note bad">{escape(provider.unavailable)}</p>'
    return (
        f'<div class="card"><a class="button approve" id="provider" href="{escape(provider.href)}">'
        f"Sign in with {escape(provider.name)}</a></div>"
    )


def _token_form(csrf: str, next_path: str, *, or_else: bool) -> str:
    return (
        ("<p><small>Or with a token:</small></p>" if or_else else "")
        + '<form class="card" method="post" action="/approvals/sign-in">'
        f'<input type="hidden" name="csrf" value="{escape(csrf)}">'
        f'<input type="hidden" name="next" value="{escape(next_path)}">'
        '<label for="token">Your token</label>'
        '<input id="token" name="token" type="password" autocomplete="off" required>'
        "<p><small>Your mcp-celery token (from <code>mcp-celery token new</code>) or a JWT of the "
        "configured issuer. It is checked and not kept; a session cookie remembers who you are.</small></p>"
        '<div class="buttons"><button class="approve" type="submit">Sign in</button></div></form>'
    )


def forward_page(title: str, text: str, to: str) -> str:
    """A page that sends the browser on to `to` at once (and links it, for a browser that does not).

    After the provider's redirect back, the page answers with this instead of a redirect: a navigation
    that started on the provider's site carries no SameSite=Strict cookie, even through a redirect to
    this site, while one that this page starts does.
    """
    head = f'<meta http-equiv="refresh" content="0;url={escape(to)}">'
    body = f'<h1>{escape(title)}</h1><p class="note ok">{escape(text)} <a href="{escape(to)}">Continue</a></p>'
    return _layout(title, body, head=head)


def list_page(principal: str, pending: Sequence[ApprovalState], sign_out_csrf: str) -> str:
    """What waits for the signed-in person."""
    if not pending:
        items = '<p class="card">Nothing waits for your decision.</p>'
    else:
        rows = "".join(
            f'<li class="card"><a href="/approvals/{escape(s.approval_id)}"><span class="message">'
            f"{escape(s.message)}</span></a><br><small>{escape(s.tool)} · asked by {escape(s.requester or '?')}"
            f" · {_when(s.asked_ms)}</small></li>"
            for s in pending
        )
        items = f'<ul class="list">{rows}</ul>'
    body = f"<h1>Waiting for your decision ({len(pending)})</h1>{items}"
    return _layout("Approvals", body, principal=principal, sign_out_csrf=sign_out_csrf)


def _facts(state: ApprovalState) -> str:
    approval = state.approval
    rows = [
        ("Tool", escape(state.tool or "?")),
        ("Asked by", escape(state.requester or "?")),
        ("Asked at", _when(state.asked_ms)),
    ]
    approvers = approval.get("approvers")
    rows.append(("Approvers", escape(", ".join(approvers)) if approvers else "anyone signed in"))
    if approval.get("fourEyes"):
        rows.append(("Rule", "four eyes: not the person who asked"))
    for title, value in (("Arguments", approval.get("arguments")), ("Details", approval.get("details"))):
        if value:
            rows.append((title, f"<pre>{escape(_json(value))}</pre>"))
    return "<dl>" + "".join(f"<dt>{title}</dt><dd>{value}</dd>" for title, value in rows) + "</dl>"


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def _outcome(state: ApprovalState) -> str:
    if state.decision is not None:
        d = state.decision
        said = f"<br>“{escape(d.comment)}”" if d.comment else ""
        css = "ok" if d.approved else "bad"
        verdict = "Approved" if d.approved else "Denied"
        at = _when(int(d.at.timestamp() * 1000))
        return f'<p class="note {css}"><strong>{verdict} by {escape(d.by)}</strong> at {at}.{said}</p>'
    if state.state == "withdrawn":
        return '<p class="note">Withdrawn: the task was cancelled, so there is nothing to decide.</p>'
    return '<p class="note">Closed: the task no longer waits for this decision (it ended or timed out).</p>'


def approval_page(state: ApprovalState, principal: str, csrf: str, sign_out_csrf: str, note: str = "") -> str:
    """One approval: what is asked, by whom, and Approve / Deny, or what became of it."""
    shown = f'<p class="note bad">{escape(note)}</p>' if note else ""
    if state.state == "open":
        action = f"/approvals/{escape(state.approval_id)}"
        decide = (
            f'<form class="card" method="post" action="{action}">'
            f'<input type="hidden" name="csrf" value="{escape(csrf)}">'
            '<label for="comment">Comment (optional)</label><textarea id="comment" name="comment" maxlength="2000">'
            "</textarea>"
            '<div class="buttons"><button class="approve" type="submit" name="decision" value="approve">Approve'
            '</button><button class="deny" type="submit" name="decision" value="deny">Deny</button></div></form>'
        )
    else:
        decide = _outcome(state)
    body = (
        f'<h1>Approval requested</h1>{shown}<div class="card"><p class="message">{escape(state.message)}</p>'
        f"{_facts(state)}</div>{decide}"
    )
    return _layout("Approval", body, principal=principal, sign_out_csrf=sign_out_csrf)


def message_page(title: str, text: str, principal: str | None = None, sign_out_csrf: str = "") -> str:
    """A page that only says something: not found, not yours to decide, too many attempts."""
    body = (
        f'<h1>{escape(title)}</h1><p class="note bad">{escape(text)}</p><p><a href="/approvals">All approvals</a></p>'
    )
    return _layout(title, body, principal=principal, sign_out_csrf=sign_out_csrf)
