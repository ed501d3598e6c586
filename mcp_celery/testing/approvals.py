"""The approval page (`/approvals`) driven as a browser without JavaScript drives it: forms, cookies
and redirects by hand (the session cookie is Secure, so an HTTP client keeps it itself).

Used by `mcp-celery demo` (bob approves the release) and by the approval tests.
"""

from __future__ import annotations

import re
from typing import Any

import httpx

__all__ = ["PageClient", "approval_path", "csrf_of"]


class PageClient:
    """One person's session on the approval page of the server at `base` (`http://host:port`).

    `headers` go with every request (`X-Forwarded-For`: a client behind a trusted proxy).
    """

    def __init__(self, base: str, headers: dict[str, str] | None = None) -> None:
        self.http = httpx.Client(base_url=base, follow_redirects=False, timeout=30, headers=headers)
        self.cookies: dict[str, str] = {}

    def _keep(self, response: httpx.Response) -> httpx.Response:
        for header in response.headers.get_list("set-cookie"):
            name, _, rest = header.partition("=")
            value = rest.split(";", 1)[0]
            if "Max-Age=0" in header:
                self.cookies.pop(name, None)
            else:
                self.cookies[name] = value
        return response

    def _cookie_header(self) -> dict[str, str]:
        return {"Cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items())} if self.cookies else {}

    def get(self, path: str) -> httpx.Response:
        return self._keep(self.http.get(path, headers=self._cookie_header()))

    def post(self, path: str, form: dict[str, str]) -> httpx.Response:
        return self._keep(self.http.post(path, data=form, headers=self._cookie_header()))

    def sign_in(self, token: str) -> httpx.Response:
        page = self.get("/approvals")
        return self.post(
            "/approvals/sign-in",
            {"csrf": csrf_of(page.text, "/approvals/sign-in"), "next": "/approvals", "token": token},
        )

    def decide(self, path: str, decision: str, comment: str = "") -> httpx.Response:
        """Approve or deny (`decision`: "approve" or "deny") the approval at `path` with its form."""
        page = self.get(path)
        return self.post(path, {"csrf": csrf_of(page.text, path), "decision": decision, "comment": comment})

    def close(self) -> None:
        self.http.close()


def csrf_of(page: str, action: str) -> str:
    """The CSRF token of the page's form that posts to `action`.

    Raises:
        LookupError: the page has no such form.
    """
    found = re.search(rf'action="{re.escape(action)}"><input type="hidden" name="csrf" value="([^"]+)"', page)
    if found is None:
        raise LookupError(f"no form posting to {action} on the page:\n{page[:2000]}")
    return found.group(1)


def approval_path(task: dict[str, Any]) -> str:
    """The page path (`/approvals/ID`) of a task's one approval request, from its `inputRequests`."""
    (request,) = task["inputRequests"].values()
    return "/approvals/" + str(request["params"]["url"]).rsplit("/approvals/", 1)[1]
