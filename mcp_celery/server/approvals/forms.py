"""What the approval page reads of a request: its cookies and its form, bounded and checked before use.

Server tier, the approval page's own. A form is small (a CSRF token, a decision, a comment of at most
2000 characters, or a token to sign in with), so a body over `MAX_FORM_BYTES` is refused with 413
before any of it is read (`limited`: by its Content-Length, or as it arrives), and the form parser
takes at most `MAX_FORM_FIELDS` fields and no file. A cookie or CSRF token that is not ASCII is no
browser's of this page. Each of those raises Starlette's `HTTPException` with 400 (as its own form
parser does), which the page answers with a page of its own.
"""

from __future__ import annotations

from mcp.server.transport_security import RequestBodyLimitMiddleware
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp

__all__ = ["MAX_FORM_BYTES", "MAX_FORM_FIELDS", "client", "cookie", "field", "limited", "malformed", "read_form"]

#: The largest body any form of the page may have (a JWT to sign in with is the largest field).
MAX_FORM_BYTES = 64 * 1024
#: The most fields any form of the page may have (each has three).
MAX_FORM_FIELDS = 8


def malformed(why: str) -> HTTPException:
    """The 400 of a request no form of the page sends: a non-ASCII cookie or token, a file, too many fields."""
    return HTTPException(400, why)


def limited(app: ASGIApp) -> ASGIApp:
    """`app` behind the body limit: 413 for a declared or received body over MAX_FORM_BYTES, unread."""
    return RequestBodyLimitMiddleware(app, MAX_FORM_BYTES)


async def read_form(request: Request) -> FormData:
    """The request's form: at most MAX_FORM_FIELDS fields, no file.

    Raises:
        HTTPException: 400, more fields, a file, or a body the parser refuses (it raises that itself).
    """
    form = await request.form(max_files=0, max_fields=MAX_FORM_FIELDS, max_part_size=MAX_FORM_BYTES)
    if any(isinstance(value, UploadFile) for value in form.values()):
        raise malformed("a file where the page has none")
    return form


def cookie(request: Request, name: str) -> str | None:
    """The value of the page's cookie `name`, if sent.

    Raises:
        HTTPException: 400, the value is not ASCII (every value the page sets is).
    """
    return _ascii(request.cookies.get(name))


def field(form: FormData, name: str) -> str | None:
    """A form field that the page fills with a token (the CSRF token), if sent.

    Raises:
        HTTPException: 400, the value is not ASCII (every token the page makes is).
    """
    value = form.get(name)
    return _ascii(value) if isinstance(value, str) else None


def client(request: Request) -> str:
    """The client's address: the peer's, or behind MCP_CELERY_TRUSTED_PROXIES the one they forward
    (uvicorn has put it in the scope already)."""
    return request.client.host if request.client else "unknown"


def _ascii(value: str | None) -> str | None:
    if value is not None and not value.isascii():
        raise malformed("a cookie or form token that is not ASCII")
    return value
