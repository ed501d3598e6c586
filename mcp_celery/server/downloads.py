"""`GET /artifacts/{taskId}/{name}`: a task's artifact over HTTP, streamed, with Range requests.

Server tier, a surface over the task service beside `resources/read` (`mcp_celery.server.resources`),
for artifacts of any size. The same credentials as `/mcp` (the bearer token the SDK's verifier
checks there; none when the server has no authentication), and the same lookup: the service's owner
check, so an unknown, expired or foreign task and an unknown name all get the one 404.

The answer carries the artifact's SHA-256 twice: as `Repr-Digest` (RFC 9530, of the whole artifact,
also on a 206) and as a strong `ETag`. One `Range: bytes=...` is honoured (206 with
`Content-Range`; 416 when it lies past the end); several ranges in one request get the whole
artifact (200), which RFC 9110 allows.

The bytes are the job's and so is their Content-Type, served on the same origin as the approval
page: `X-Content-Type-Options: nosniff` and `Content-Security-Policy: sandbox` keep a browser that
opens one (an HTML or SVG artifact, say) from running it as this origin's page.
"""

from __future__ import annotations

import base64
import re
from urllib.parse import quote

from mcp.server.auth.provider import TokenVerifier
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from mcp_celery.server.engine.artifacts import Artifact
from mcp_celery.server.engine.service import TaskService

__all__ = ["CONTENT_HEADERS", "Downloads", "byte_range"]

_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
#: On every answer with an artifact's bytes: never sniffed, never a page of this origin (see the docstring).
CONTENT_HEADERS = {"X-Content-Type-Options": "nosniff", "Content-Security-Policy": "sandbox"}


def byte_range(header: str | None, size: int) -> tuple[int, int] | None | bool:
    """`(start, end)` (end exclusive) of a single-range header; None: no usable range (send it all);
    False: unsatisfiable (416)."""
    if not header or "," in header:
        return None
    match = _RANGE.fullmatch(header.strip())
    if match is None:
        return None
    first, last = match.groups()
    if not first and not last:
        return None
    if not first:  # the last N bytes
        suffix = int(last)
        return (max(size - suffix, 0), size) if suffix > 0 and size > 0 else False
    start = int(first)
    end = min(int(last) + 1, size) if last else size
    if start >= size or (last and int(last) < start):
        return False
    return start, end


class Downloads:
    """The download endpoint, over one task service."""

    def __init__(self, service: TaskService, verifier: TokenVerifier | None) -> None:
        self.service = service
        self.verifier = verifier

    async def endpoint(self, request: Request) -> Response:
        """The answer to one GET: 401, 404, 416, or the bytes (200, or 206 for a range)."""
        principal = await self._principal(request)
        if principal is None:
            return JSONResponse(
                {"error": "invalid_token", "error_description": "a bearer token is required, as for /mcp"},
                status_code=401,
                headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
            )
        task_id, name = request.path_params["task_id"], request.path_params["name"]
        artifact = await self.service.find_artifact(principal, task_id, name)
        if artifact is None:
            return JSONResponse({"error": "not found"}, status_code=404)
        return self._answer(request, artifact)

    async def _principal(self, request: Request) -> str | None:
        """The caller as `/mcp` knows it: the token's principal; "" without authentication; None: refused."""
        if self.verifier is None:
            return ""
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            return None
        verified = await self.verifier.verify_token(token.strip())
        return None if verified is None else verified.client_id

    def _answer(self, request: Request, artifact: Artifact) -> Response:
        meta = artifact.meta
        digest = base64.b64encode(bytes.fromhex(meta.sha256)).decode()
        headers = {
            **CONTENT_HEADERS,
            "Accept-Ranges": "bytes",
            "ETag": f'"{meta.sha256}"',
            "Repr-Digest": f"sha-256=:{digest}:",
            "Content-Disposition": f"attachment; filename*=UTF-8''{quote(meta.name, safe='')}",
            "Cache-Control": "private, no-store",
        }
        wanted = byte_range(request.headers.get("range"), meta.size)
        if wanted is False:
            headers["Content-Range"] = f"bytes */{meta.size}"
            return Response(status_code=416, headers=headers)
        start, end = wanted if isinstance(wanted, tuple) else (0, meta.size)
        headers["Content-Length"] = str(end - start)
        status = 200
        if isinstance(wanted, tuple):
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{meta.size}"
        chunks = self.service.artifacts.chunks(artifact, start, end)
        return StreamingResponse(chunks, status_code=status, headers=headers, media_type=meta.mime_type)
