"""The approval page under `/approvals` of `mcp-celery serve --http`: sign in, list, decide.

Server tier, a surface over the task service like `tasks/` and `plain/`, translating shapes only:
who may decide, the validation of the decision and the resume of the parked job are the service's
(`mcp_celery.server.engine.approvals.decide` answers through `TaskService.answer`). Sign-in takes
the approver's own credential and checks it with the server's token verifier (`edge/auth.py`: the
tokens file, JWT), then keeps only the principal's name in a signed session cookie (`session`).

Every response carries a strict Content-Security-Policy (nothing but this origin's stylesheet, forms
posting to this origin only, no framing), `no-store` and `no-referrer`; every form carries a CSRF
token; sign-in attempts are counted per client address in Redis, across replicas. Nothing secret
reaches a page or a log line: the token is never echoed, principals are logged as digests.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from mcp.server.auth.provider import TokenVerifier
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from mcp_celery import logs
from mcp_celery.server.approvals import html
from mcp_celery.server.approvals.session import COOKIE, PRE_COOKIE, Session, SessionKeys, cookie_header
from mcp_celery.server.engine import approvals
from mcp_celery.server.engine.service import TaskService

__all__ = ["SECURITY_HEADERS", "approval_app"]

logger = logging.getLogger(__name__)

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
}
#: The window the sign-in attempts of one address are counted in.
SIGN_IN_WINDOW_S = 60
#: The longest comment kept with a decision.
MAX_COMMENT = 2000


class ApprovalPages:
    """The page's handlers; `approval_app` routes to them."""

    def __init__(self, service: TaskService, verifier: TokenVerifier | None) -> None:
        self.service = service
        self.verifier = verifier
        self.settings = service.settings
        self._keys: SessionKeys | None = None

    @property
    def keys(self) -> SessionKeys:
        if self._keys is None:
            self._keys = SessionKeys(self.service.state_secret)
        return self._keys

    def _page(self, text: str, status: int = 200, cookies: tuple[str, ...] = ()) -> Response:
        response = HTMLResponse(text, status_code=status, headers=SECURITY_HEADERS)
        for cookie in cookies:
            response.headers.append("Set-Cookie", cookie)
        return response

    def _session(self, request: Request) -> Session | None:
        return self.keys.session(request.cookies.get(COOKIE))

    def _sign_in(self, request: Request, next_path: str, error: str = "", status: int = 200) -> Response:
        """The sign-in form, with a fresh nonce cookie for its CSRF token."""
        nonce = request.cookies.get(PRE_COOKIE) or secrets.token_urlsafe(16)
        page = html.sign_in_page(self.keys.csrf(nonce, "/approvals/sign-in"), next_path, error)
        return self._page(page, status, (cookie_header(PRE_COOKIE, nonce, 600),))

    async def style(self, request: Request) -> Response:
        headers = {**SECURITY_HEADERS, "Cache-Control": "public, max-age=3600"}
        return Response(html.STYLE, media_type="text/css", headers=headers)

    async def index(self, request: Request) -> Response:
        session = self._session(request)
        if session is None:
            return self._sign_in(request, "/approvals")
        pending = await approvals.pending_for(self.service, session.principal)
        return self._page(html.list_page(session.principal, pending, self._sign_out_csrf(session)))

    def _sign_out_csrf(self, session: Session) -> str:
        return self.keys.csrf(session.nonce, "/approvals/sign-out")

    async def sign_in(self, request: Request) -> Response:
        form = await request.form()
        next_path = str(form.get("next") or "/approvals")
        if not next_path.startswith("/approvals") or "//" in next_path or "\\" in next_path:
            next_path = "/approvals"  # never a redirect off the page
        if not self.keys.csrf_ok(request.cookies.get(PRE_COOKIE), "/approvals/sign-in", form.get("csrf")):
            return self._sign_in(request, next_path, "The form expired; please sign in again.", 403)
        address = request.client.host if request.client else "unknown"
        source = self.keys.source(address)
        if await self.service.store.failed_sign_ins(source) >= self.settings.approval_sign_in_limit:
            logger.warning("approval page: too many sign-in attempts from one address")
            return self._page(html.message_page("Too many attempts", "Wait a minute before you try again."), 429)
        token = form.get("token")
        found = await self.verifier.verify_token(token) if self.verifier and isinstance(token, str) and token else None
        if found is None:
            await self.service.store.count_failed_sign_in(source, SIGN_IN_WINDOW_S)
            logger.info("approval page: sign-in refused")
            why = "That token was not accepted." if self.verifier else "This server has no authentication configured."
            return self._sign_in(request, next_path, why, 401)
        session, value = self.keys.new_session(found.client_id, self.settings.approval_session_s)
        logger.info("approval page: signed in", extra={"principal": logs.principal_digest(session.principal)})
        response = RedirectResponse(next_path, status_code=303, headers=SECURITY_HEADERS)
        response.headers.append("Set-Cookie", cookie_header(COOKIE, value, self.settings.approval_session_s))
        response.headers.append("Set-Cookie", cookie_header(PRE_COOKIE, "", 0))
        return response

    async def sign_out(self, request: Request) -> Response:
        session = self._session(request)
        form = await request.form()
        if session is not None and not self.keys.csrf_ok(session.nonce, "/approvals/sign-out", form.get("csrf")):
            return self._page(html.message_page("Refused", "The form expired; reload the page."), 403)
        response = RedirectResponse("/approvals", status_code=303, headers=SECURITY_HEADERS)
        response.headers.append("Set-Cookie", cookie_header(COOKIE, "", 0))
        return response

    async def approval(self, request: Request) -> Response:
        approval_id = request.path_params["approval_id"]
        session = self._session(request)
        if session is None:
            return self._sign_in(request, f"/approvals/{approval_id}")
        state = await approvals.find(self.service, approval_id)
        if state is None:
            return self._not_found(session)
        return self._show(state, session)

    def _not_found(self, session: Session) -> Response:
        text = "No such approval: the link is wrong, or its task has expired."
        return self._page(html.message_page("Not found", text, session.principal, self._sign_out_csrf(session)), 404)

    def _show(self, state: approvals.ApprovalState, session: Session, note: str = "", status: int = 200) -> Response:
        if (refusal := state.refusal(session.principal)) is not None:
            page = html.message_page("Not yours to decide", refusal, session.principal, self._sign_out_csrf(session))
            return self._page(page, 403)
        csrf = self.keys.csrf(session.nonce, f"/approvals/{state.approval_id}")
        page = html.approval_page(state, session.principal, csrf, self._sign_out_csrf(session), note)
        return self._page(page, status)

    async def decide(self, request: Request) -> Response:
        approval_id = request.path_params["approval_id"]
        session = self._session(request)
        if session is None:
            return self._sign_in(request, f"/approvals/{approval_id}", "Sign in to decide.", 401)
        form = await request.form()
        if not self.keys.csrf_ok(session.nonce, f"/approvals/{approval_id}", form.get("csrf")):
            text = "The form was not sent from this page (missing or wrong CSRF token); nothing was decided."
            return self._page(html.message_page("Refused", text, session.principal, self._sign_out_csrf(session)), 403)
        state = await approvals.find(self.service, approval_id)
        if state is None:
            return self._not_found(session)
        if state.refusal(session.principal) is not None:
            return self._show(state, session)
        choice = form.get("decision")
        if choice not in ("approve", "deny"):
            return self._show(state, session, "Choose Approve or Deny.", 400)
        comment = str(form.get("comment") or "").strip()[:MAX_COMMENT]
        outcome, why = await approvals.decide(
            self.service, state, session.principal, approved=choice == "approve", comment=comment
        )
        if outcome == "refused":
            return self._show(state, session, why, 403)
        state = await approvals.find(self.service, approval_id) or state
        if outcome == "too late":
            return self._show(state, session, "This approval was already decided or withdrawn; nothing changed.", 409)
        return RedirectResponse(f"/approvals/{approval_id}", status_code=303, headers=SECURITY_HEADERS)


def approval_app(service: TaskService, verifier: TokenVerifier | None) -> Any:
    """The ASGI app of the pages under `/approvals` (`http.py` sends that path here)."""
    pages = ApprovalPages(service, verifier)
    return Starlette(
        routes=[
            Route("/approvals", pages.index, methods=["GET"]),
            Route("/approvals/style.css", pages.style, methods=["GET"]),
            Route("/approvals/sign-in", pages.sign_in, methods=["POST"]),
            Route("/approvals/sign-out", pages.sign_out, methods=["POST"]),
            Route("/approvals/{approval_id}", pages.approval, methods=["GET"]),
            Route("/approvals/{approval_id}", pages.decide, methods=["POST"]),
        ]
    )
