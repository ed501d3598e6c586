"""The approval page: where a named person decides what a job asked (`JobContext.approve`).

    pages.py          the routes under /approvals: sign-in, the list, one approval, Approve / Deny
    session.py        the session cookie, CSRF tokens, the sign-in attempt counter's key
    forms.py          what the page reads of a request: cookies and forms, bounded and checked first
    html.py           the server-rendered pages and their one stylesheet
    oidc.py           OpenID Connect: the provider (discovery), the authorization request, the ID token
    oidc_attempts.py  a sign-in on its way through the provider: kept in Redis, taken once, bound to its browser

A surface over the task service (`mcp_celery.server.engine.approvals`), like `tasks/` and `plain/`.
"""

from mcp_celery.server.approvals.oidc import oidc_client
from mcp_celery.server.approvals.pages import approval_app

__all__ = ["approval_app", "oidc_client"]
