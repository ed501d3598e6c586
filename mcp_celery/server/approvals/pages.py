"""The approval page under `/approvals` of `mcp-celery serve --http`: sign in, list, decide.

Server tier, a surface over the task service like `tasks/` and `plain/`, translating shapes only:
who may decide, the validation of the decision and the resume of the parked job are the service's
(`mcp_celery.server.engine.approvals.decide` answers through `TaskService.answer`). Sign-in takes
the approver's own credential and checks it with the server's token verifier (`edge/auth.py`: the
tokens file, JWT), then opens a session in Redis (`edge/sessions.py`) that every request checks
again: signing out ends it there, and so does the credential's end (a token revoked, a JWT's `exp`).

Every response carries a strict Content-Security-Policy (nothing but this origin's stylesheet, forms
posting to this origin only, no framing), `no-store` and `Referrer-Policy: same-origin`; every form
carries a CSRF token; forms are bounded before they are read (`forms`); sign-in attempts are counted
per client in Redis, across replicas, before the credential is checked. Nothing secret reaches a page
or a log line: the token is never echoed, principals are logged as digests.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from mcp_celery import logs
from mcp_celery.server.approvals import forms, html
from mcp_celery.server.approvals.oidc import OidcClient, SignInRefused
from mcp_celery.server.approvals.oidc_attempts import BINDING_COOKIE, SignInAttempts, binding_cookie
from mcp_celery.server.approvals.session import COOKIE, PRE_COOKIE, FormKeys, cookie_header
from mcp_celery.server.edge.auth import Verifiers
from mcp_celery.server.edge.sessions import Credential, Session, SessionStore
from mcp_celery.server.engine import approvals
from mcp_celery.server.engine.service import TaskService

__all__ = ["SECURITY_HEADERS", "approval_app"]

logger = logging.getLogger(__name__)

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    # Nothing to other sites; not `no-referrer`, under which a browser posts this page's own forms with
    # `Origin: null`, which the Origin check (`edge.hosts`) refuses as it refuses a sandboxed attacker's.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
}
#: The window the sign-in attempts of one client are counted in.
SIGN_IN_WINDOW_S = 60
#: The kind of credential (`edge.sessions.Credential`) of a session opened by an OpenID Connect sign-in.
OIDC = "oidc"
#: The longest comment kept with a decision.
MAX_COMMENT = 2000

Handler = Callable[[Request], Awaitable[Response]]


class ApprovalPages:
    """The page's handlers; `approval_app` routes to them."""

    def __init__(self, service: TaskService, verifier: Verifiers | None, oidc: OidcClient | None = None) -> None:
        self.service = service
        self.verifier = verifier
        self.settings = service.settings
        self._keys: FormKeys | None = None
        self._sessions: SessionStore | None = None
        self.oidc = oidc
        self._attempts: SignInAttempts | None = None
        # The token form: with tokens or JWTs configured (unless turned off), or when nothing else signs in.
        self.token_form = (verifier is not None and self.settings.approval_token_sign_in) or oidc is None

    @property
    def keys(self) -> FormKeys:
        if self._keys is None:
            self._keys = FormKeys(self.service.state_secret)
        return self._keys

    @property
    def sessions(self) -> SessionStore:
        """The sessions, re-checked by the verifiers' checks (a sign-in of another kind adds its own)."""
        if self._sessions is None:
            checks = self.verifier.checks() if self.verifier is not None else {}
            if self.oidc is not None:
                checks[OIDC] = self.oidc.still_holds
            self._sessions = SessionStore(self.service.store, checks, self.settings.approval_session_s)
        return self._sessions

    @property
    def attempts(self) -> SignInAttempts | None:
        """The OpenID Connect sign-ins under way (None: not configured), made on first use as the sessions are."""
        if self._attempts is None and self.oidc is not None:
            self._attempts = SignInAttempts(self.oidc, self.service.store)
        return self._attempts

    def _page(self, text: str, status: int = 200, cookies: tuple[str, ...] = ()) -> Response:
        response = HTMLResponse(text, status_code=status, headers=SECURITY_HEADERS)
        for cookie in cookies:
            response.headers.append("Set-Cookie", cookie)
        return response

    async def _session(self, request: Request) -> Session | None:
        """The signed-in session, if its cookie names an open one whose credential still holds."""
        return await self.sessions.find(forms.cookie(request, COOKIE))

    async def _sign_in(self, request: Request, next_path: str, error: str = "", status: int = 200) -> Response:
        """The sign-in page, with a fresh nonce cookie for its form's CSRF token."""
        nonce = forms.cookie(request, PRE_COOKIE) or secrets.token_urlsafe(16)
        provider = None
        if self.oidc is not None:
            unavailable = "" if await self.oidc.available() else self.oidc.unavailable_text
            href = "/approvals/oidc/start?" + urlencode({"next": next_path})
            provider = html.SignInLink(self.oidc.config.provider_name, href, unavailable)
        csrf = self.keys.csrf(nonce, "/approvals/sign-in")
        page = html.sign_in_page(csrf, next_path, error, provider=provider, token_form=self.token_form)
        return self._page(page, status, (cookie_header(PRE_COOKIE, nonce, 600),))

    def refusing_malformed(self, handler: Handler) -> Handler:
        """`handler`, answering 400 with a page of its own to a request no form of the page sends (`forms`)."""

        async def guarded(request: Request) -> Response:
            try:
                for name in (COOKIE, PRE_COOKIE):  # whether or not this handler reads it
                    forms.cookie(request, name)
                return await handler(request)
            except HTTPException as exc:
                if exc.status_code != 400:
                    raise
                logger.info("approval page: malformed request refused: %s", exc.detail)
                text = "The request carries a cookie or form this page never sends; reload the page."
                return self._page(html.message_page("Bad request", text), 400)

        return guarded

    async def style(self, request: Request) -> Response:
        headers = {**SECURITY_HEADERS, "Cache-Control": "public, max-age=3600"}
        return Response(html.STYLE, media_type="text/css", headers=headers)

    async def index(self, request: Request) -> Response:
        session = await self._session(request)
        if session is None:
            return await self._sign_in(request, "/approvals")
        pending = await approvals.pending_for(self.service, session.principal)
        return self._page(html.list_page(session.principal, pending, self._sign_out_csrf(session)))

    def _sign_out_csrf(self, session: Session) -> str:
        return self.keys.csrf(session.nonce, "/approvals/sign-out")

    async def sign_in(self, request: Request) -> Response:
        form = await forms.read_form(request)
        next_path = _on_the_page(form.get("next"))
        nonce = forms.cookie(request, PRE_COOKIE)
        if not self.keys.csrf_ok(nonce, "/approvals/sign-in", forms.field(form, "csrf")):
            return await self._sign_in(request, next_path, "The form expired; please sign in again.", 403)
        source = self.keys.source(forms.client(request))
        # Counted before the credential is checked: of a burst, no more than the limit are ever checked.
        if await self.service.store.count_sign_in(source, SIGN_IN_WINDOW_S) > self.settings.approval_sign_in_limit:
            logger.warning("approval page: too many sign-in attempts from one client")
            return self._page(html.message_page("Too many attempts", "Wait a minute before you try again."), 429)
        token = form.get("token")
        found = await self.verifier.identify(token) if self.verifier and isinstance(token, str) and token else None
        opened = None if found is None else await self.sessions.open(found[0].client_id, found[1])
        if opened is None:
            logger.info("approval page: sign-in refused")
            why = "That token was not accepted." if self.verifier else "This server has no authentication configured."
            return await self._sign_in(request, next_path, why, 401)
        await self.service.store.forgive_sign_in(source, SIGN_IN_WINDOW_S)  # only failures count
        session, session_id = opened
        logger.info("approval page: signed in", extra={"principal": logs.principal_digest(session.principal)})
        response = RedirectResponse(next_path, status_code=303, headers=SECURITY_HEADERS)
        lasts = max(session.expires_at - int(time.time()), 1)
        response.headers.append("Set-Cookie", cookie_header(COOKIE, session_id, lasts))
        response.headers.append("Set-Cookie", cookie_header(PRE_COOKIE, "", 0))
        return response

    async def sign_out(self, request: Request) -> Response:
        """End the session here, not only in this browser: its cookie opens nothing afterwards."""
        form = await forms.read_form(request)
        session_id = forms.cookie(request, COOKIE)
        session = await self.sessions.find(session_id)
        if session is not None and not self.keys.csrf_ok(
            session.nonce, "/approvals/sign-out", forms.field(form, "csrf")
        ):
            return self._page(html.message_page("Refused", "The form expired; reload the page."), 403)
        await self.sessions.end(session_id)
        oidc = self.oidc
        if oidc is not None and session is not None and session.credential.kind == OIDC:
            at_provider = await oidc.end_session_url(session.credential.reference)
        else:
            at_provider = None
        if oidc is not None and at_provider is not None:  # RP-initiated logout: not governed by CSP form-action
            text = f"Signed out here; now signing you out at {oidc.config.provider_name}."
            page = html.forward_page("Signed out", text, at_provider)
            return self._page(page, 200, (cookie_header(COOKIE, "", 0),))
        response = RedirectResponse("/approvals", status_code=303, headers=SECURITY_HEADERS)
        response.headers.append("Set-Cookie", cookie_header(COOKIE, "", 0))
        return response

    async def oidc_start(self, request: Request, next_path: str | None = None) -> Response:
        """Send the person to the provider (a GET, so that the CSP's `form-action 'self'` never applies)."""
        attempts = self.attempts
        if attempts is None:
            return self._page(html.message_page("Not found", "OpenID Connect sign-in is not configured."), 404)
        # A start keeps an attempt in Redis for ATTEMPT_S: counted as a sign-in attempt (its callback's
        # success takes it back), so that one client cannot fill Redis with them.
        if await self._counted_over_limit(request):
            return self._page(html.message_page("Too many attempts", "Wait a minute before you try again."), 429)
        next_path = next_path or _on_the_page(request.query_params.get("next"))
        try:
            url, cookie = await attempts.start(next_path, forms.cookie(request, BINDING_COOKIE))
        except SignInRefused as refused:
            return self._page(html.message_page("Sign-in unavailable", refused.shown), refused.status)
        response = RedirectResponse(url, status_code=303, headers=SECURITY_HEADERS)
        response.headers.append("Set-Cookie", cookie)
        return response

    async def _counted_over_limit(self, request: Request) -> bool:
        """Count one sign-in attempt of the request's client; True past MCP_CELERY_APPROVAL_SIGN_IN_LIMIT."""
        source = self.keys.source(forms.client(request))
        if await self.service.store.count_sign_in(source, SIGN_IN_WINDOW_S) > self.settings.approval_sign_in_limit:
            logger.warning("approval page: too many sign-in attempts from one client")
            return True
        return False

    async def oidc_callback(self, request: Request) -> Response:
        """The provider's redirect back: finish the attempt, open a session, go on to the page asked for."""
        attempts = self.attempts
        if attempts is None:
            return self._page(html.message_page("Not found", "OpenID Connect sign-in is not configured."), 404)
        if await self._counted_over_limit(request):
            return self._page(html.message_page("Too many attempts", "Wait a minute before you try again."), 429)
        try:
            identity, next_path = await attempts.finish(request.query_params, forms.cookie(request, BINDING_COOKIE))
        except SignInRefused as refused:
            logger.warning("approval page: OpenID Connect sign-in refused (%d): %s", refused.status, refused)
            return self._page(html.message_page("Not signed in", refused.shown), refused.status)
        # The ID token is kept as the credential: the session ends at its exp, and sign-out hands it to the
        # provider (id_token_hint); it opens nothing but this page's session.
        credential = Credential(OIDC, identity.id_token, identity.expires_at)
        opened = await self.sessions.open(identity.principal, credential)
        if opened is None:
            return self._page(html.message_page("Not signed in", "Your sign-in has expired; sign in again."), 403)
        source = self.keys.source(forms.client(request))
        for _ in ("the start", "this callback"):  # only failures count
            await self.service.store.forgive_sign_in(source, SIGN_IN_WINDOW_S)
        session, session_id = opened
        logger.info(
            "approval page: signed in with OpenID Connect",
            extra={"principal": logs.principal_digest(session.principal)},
        )
        lasts = max(session.expires_at - int(time.time()), 1)
        page = html.forward_page("Signed in", f"Signed in as {session.principal}.", next_path)
        cookies = (cookie_header(COOKIE, session_id, lasts), binding_cookie("", 0), cookie_header(PRE_COOKIE, "", 0))
        return self._page(page, 200, cookies)

    async def approval(self, request: Request) -> Response:
        approval_id = request.path_params["approval_id"]
        session = await self._session(request)
        if session is None:
            if self.oidc is not None and not self.token_form:  # the link goes straight to the provider
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
        form = await forms.read_form(request)
        session = await self._session(request)  # the credential checked again, at each decision
        if session is None:
            return await self._sign_in(request, f"/approvals/{approval_id}", "Sign in to decide.", 401)
        if not self.keys.csrf_ok(session.nonce, f"/approvals/{approval_id}", forms.field(form, "csrf")):
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


def approval_app(service: TaskService, verifier: Verifiers | None, oidc: OidcClient | None = None) -> Any:
    """The ASGI app of the pages under `/approvals` (`http.py` sends that path here), behind the form body limit."""
    pages = ApprovalPages(service, verifier, oidc)
    guard = pages.refusing_malformed
    return forms.limited(
        Starlette(
            routes=[
                Route("/approvals", guard(pages.index), methods=["GET"]),
                Route("/approvals/style.css", pages.style, methods=["GET"]),
                Route("/approvals/sign-in", guard(pages.sign_in), methods=["POST"]),
                Route("/approvals/sign-out", guard(pages.sign_out), methods=["POST"]),
                Route("/approvals/oidc/start", guard(pages.oidc_start), methods=["GET"]),
                Route("/approvals/oidc/callback", guard(pages.oidc_callback), methods=["GET"]),
                Route("/approvals/{approval_id}", guard(pages.approval), methods=["GET"]),
                Route("/approvals/{approval_id}", guard(pages.decide), methods=["POST"]),
            ]
        )
    )
