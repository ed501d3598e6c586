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
import time
from typing import Any
from urllib.parse import urlencode

from mcp.server.auth.provider import TokenVerifier
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from mcp_celery import logs
from mcp_celery.server.approvals import html
from mcp_celery.server.approvals.oidc import OidcClient, SignInRefused
from mcp_celery.server.approvals.oidc_attempts import BINDING_COOKIE, SignInAttempts, binding_cookie
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

    def __init__(self, service: TaskService, verifier: TokenVerifier | None, oidc: OidcClient | None = None) -> None:
        self.service = service
        self.verifier = verifier
        self.settings = service.settings
        self._keys: SessionKeys | None = None
        self.oidc = oidc
        self.attempts = SignInAttempts(oidc, service.store) if oidc is not None else None
        # The token form: with tokens or JWTs configured (unless turned off), or when nothing else signs in.
        self.token_form = (verifier is not None and self.settings.approval_token_sign_in) or oidc is None

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

    async def _sign_in(self, request: Request, next_path: str, error: str = "", status: int = 200) -> Response:
        """The sign-in page, with a fresh nonce cookie for its form's CSRF token."""
        nonce = request.cookies.get(PRE_COOKIE) or secrets.token_urlsafe(16)
        provider = None
        if self.oidc is not None:
            unavailable = "" if await self.oidc.available() else self.oidc.unavailable_text
            href = "/approvals/oidc/start?" + urlencode({"next": next_path})
            provider = html.SignInLink(self.oidc.config.provider_name, href, unavailable)
        csrf = self.keys.csrf(nonce, "/approvals/sign-in")
        page = html.sign_in_page(csrf, next_path, error, provider=provider, token_form=self.token_form)
        return self._page(page, status, (cookie_header(PRE_COOKIE, nonce, 600),))

    async def style(self, request: Request) -> Response:
        headers = {**SECURITY_HEADERS, "Cache-Control": "public, max-age=3600"}
        return Response(html.STYLE, media_type="text/css", headers=headers)

    async def index(self, request: Request) -> Response:
        session = self._session(request)
        if session is None:
            return await self._sign_in(request, "/approvals")
        pending = await approvals.pending_for(self.service, session.principal)
        return self._page(html.list_page(session.principal, pending, self._sign_out_csrf(session)))

    def _sign_out_csrf(self, session: Session) -> str:
        return self.keys.csrf(session.nonce, "/approvals/sign-out")

    async def sign_in(self, request: Request) -> Response:
        form = await request.form()
        next_path = _on_the_page(form.get("next"))
        if not self.keys.csrf_ok(request.cookies.get(PRE_COOKIE), "/approvals/sign-in", form.get("csrf")):
            return await self._sign_in(request, next_path, "The form expired; please sign in again.", 403)
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
            return await self._sign_in(request, next_path, why, 401)
        session, value = self.keys.new_session(found.client_id, self.settings.approval_session_s)
        logger.info("approval page: signed in", extra={"principal": logs.principal_digest(session.principal)})
        response = RedirectResponse(next_path, status_code=303, headers=SECURITY_HEADERS)
        response.headers.append("Set-Cookie", cookie_header(COOKIE, value, self.settings.approval_session_s))
        response.headers.append("Set-Cookie", cookie_header(PRE_COOKIE, "", 0))
        return response

    async def oidc_start(self, request: Request, next_path: str | None = None) -> Response:
        """Send the person to the provider (GET, so that the page's CSP `form-action 'self'` never applies)."""
        if self.attempts is None:
            return self._page(html.message_page("Not found", "OpenID Connect sign-in is not configured."), 404)
        if await self._too_many_sign_ins(request):
            return self._page(html.message_page("Too many attempts", "Wait a minute before you try again."), 429)
        next_path = next_path or _on_the_page(request.query_params.get("next"))
        try:
            url, cookie = await self.attempts.start(next_path, request.cookies.get(BINDING_COOKIE))
        except SignInRefused as refused:
            return self._page(html.message_page("Sign-in unavailable", refused.shown), refused.status)
        response = RedirectResponse(url, status_code=303, headers=SECURITY_HEADERS)
        response.headers.append("Set-Cookie", cookie)
        return response

    async def oidc_callback(self, request: Request) -> Response:
        """The provider's redirect back: finish the attempt, open a session, go on to the page asked for."""
        if self.attempts is None:
            return self._page(html.message_page("Not found", "OpenID Connect sign-in is not configured."), 404)
        if await self._too_many_sign_ins(request):
            return self._page(html.message_page("Too many attempts", "Wait a minute before you try again."), 429)
        try:
            identity, next_path = await self.attempts.finish(request.query_params, request.cookies.get(BINDING_COOKIE))
        except SignInRefused as refused:
            await self._count_failed_sign_in(request)
            logger.warning("approval page: OpenID Connect sign-in refused (%d): %s", refused.status, refused)
            return self._page(html.message_page("Not signed in", refused.shown), refused.status)
        lifetime = min(self.settings.approval_session_s, identity.expires_at - int(time.time()))
        if lifetime <= 0:
            return self._page(html.message_page("Not signed in", "Your sign-in has expired; sign in again."), 403)
        session, value = self.keys.new_session(identity.principal, lifetime)
        logger.info(
            "approval page: signed in with OpenID Connect",
            extra={"principal": logs.principal_digest(session.principal)},
        )
        page = html.forward_page("Signed in", f"Signed in as {identity.principal}.", next_path)
        cookies = (cookie_header(COOKIE, value, lifetime), binding_cookie("", 0), cookie_header(PRE_COOKIE, "", 0))
        return self._page(page, 200, cookies)

    async def _too_many_sign_ins(self, request: Request) -> bool:
        return await self.service.store.failed_sign_ins(self._source(request)) >= self.settings.approval_sign_in_limit

    async def _count_failed_sign_in(self, request: Request) -> None:
        await self.service.store.count_failed_sign_in(self._source(request), SIGN_IN_WINDOW_S)

    def _source(self, request: Request) -> str:
        return self.keys.source(request.client.host if request.client else "unknown")

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
            if self.attempts is not None and not self.token_form:  # the link goes straight to the provider
                return await self.oidc_start(request, f"/approvals/{approval_id}")
            return await self._sign_in(request, f"/approvals/{approval_id}")
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
            return await self._sign_in(request, f"/approvals/{approval_id}", "Sign in to decide.", 401)
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


def _on_the_page(asked: object) -> str:
    """`asked` if it is a path of the page, else the list: a sign-in never sends anyone off the page."""
    path = asked if isinstance(asked, str) and asked else "/approvals"
    if not path.startswith("/approvals") or "//" in path or "\\" in path:
        return "/approvals"
    return path


def approval_app(service: TaskService, verifier: TokenVerifier | None, oidc: OidcClient | None = None) -> Any:
    """The ASGI app of the pages under `/approvals` (`http.py` sends that path here)."""
    pages = ApprovalPages(service, verifier, oidc)
    return Starlette(
        routes=[
            Route("/approvals", pages.index, methods=["GET"]),
            Route("/approvals/style.css", pages.style, methods=["GET"]),
            Route("/approvals/oidc/start", pages.oidc_start, methods=["GET"]),
            Route("/approvals/oidc/callback", pages.oidc_callback, methods=["GET"]),
            Route("/approvals/sign-in", pages.sign_in, methods=["POST"]),
            Route("/approvals/sign-out", pages.sign_out, methods=["POST"]),
            Route("/approvals/{approval_id}", pages.approval, methods=["GET"]),
            Route("/approvals/{approval_id}", pages.decide, methods=["POST"]),
        ]
    )
