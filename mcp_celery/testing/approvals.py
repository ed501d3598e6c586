"""The approval page (`/approvals`) driven as a browser without JavaScript drives it: forms, cookies
and redirects by hand (the session cookie is Secure, so an HTTP client keeps it itself).

Used by `mcp-celery demo` (bob approves the release) and by the approval tests.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlencode, urlsplit

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

    def to_provider(self, next_path: str = "/approvals") -> str:
        """Start an OpenID Connect sign-in; returns the provider's authorization URL the page sent us to."""
        start = self.get(f"/approvals/oidc/start?{urlencode({'next': next_path})}")
        if start.status_code != 303:
            raise LookupError(f"the page did not send us to the provider ({start.status_code}): {start.text[:500]}")
        return start.headers["location"]

    def at_provider(self, authorization_url: str, subject: str) -> str:
        """Sign in as `subject` on the test provider's own page (`mcp_celery.testing.oidc_provider`), as a
        person types it there; returns the page's callback URL the provider redirects back to."""
        with httpx.Client(timeout=30) as provider:
            provider.get(authorization_url).raise_for_status()  # the provider's login page, as a browser shows it
            answer = provider.post(authorization_url, data={"sub": subject})
        if answer.status_code != 302:
            raise LookupError(f"the provider did not redirect back ({answer.status_code}): {answer.text[:500]}")
        return answer.headers["location"]

    def back_from_provider(self, callback_url: str) -> httpx.Response:
        """Follow the provider's redirect back to the page (the callback), as the browser would."""
        parts = urlsplit(callback_url)
        return self.get(f"{parts.path}?{parts.query}")

    def sign_in_with_provider(self, subject: str, next_path: str = "/approvals") -> httpx.Response:
        """The whole OpenID Connect sign-in as `subject`; returns the page's answer to the callback."""
        return self.back_from_provider(self.at_provider(self.to_provider(next_path), subject))

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
