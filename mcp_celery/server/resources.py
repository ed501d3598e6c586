"""`resources/read` (and an empty `resources/list`): a task's artifacts and live output as MCP resources.

Server tier, a surface over the task service, for every client (with the tasks extension or not).
The lookup is the service's (`TaskService.find_artifact` and `find_output`, the owner check of
`tasks/get`): an unknown, expired or foreign task, a name its record does not list and a URI that is
neither an artifact's nor a task's output all get the one resource-not-found error, so a URI tells
nothing about tasks that are not the caller's. That error is -32602 (Invalid params) on 2026-07-28,
as SEP-2164 made it, and -32002 on the earlier revisions that defined that code.

An artifact larger than MCP_CELERY_ARTIFACT_READ_MAX_BYTES is refused with a message that names the
setting and the HTTP download (`mcp_celery.server.downloads`), which streams any size.
"""

from __future__ import annotations

import base64
from typing import Any

from mcp import types
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcp_celery.protocol import INVALID_PARAMS, split_output_uri
from mcp_celery.server.engine.service import TaskService
from mcp_celery.server.tasks import envelope
from mcp_celery.server.tasks.envelope import RequestContext
from mcp_celery.store.artifacts import parse_uri

__all__ = [
    "DOWNLOAD_PATH",
    "LEGACY_RESOURCE_NOT_FOUND",
    "OUTPUT_MIME",
    "list_resources",
    "read_resource",
    "resource_not_found",
]

#: The resource-not-found code of the revisions before 2026-07-28 (retired there by SEP-2164).
LEGACY_RESOURCE_NOT_FOUND = -32002
#: Where the HTTP server serves an artifact's bytes.
DOWNLOAD_PATH = "/artifacts/{task_id}/{name}"
#: A task's live output (`mcp-celery://tasks/{taskId}/output`, `mcp_celery.store.output`).
OUTPUT_MIME = "text/plain"
#: The code of a refusal that a download would not meet: JSON-RPC's "invalid request".
_TOO_LARGE = -32600


def resource_not_found(ctx: RequestContext, uri: str) -> MCPError:
    """The one error for any URI the caller may not read."""
    modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
    return MCPError(INVALID_PARAMS if modern else LEGACY_RESOURCE_NOT_FOUND, "Resource not found", {"uri": uri})


async def read_resource(
    service: TaskService, ctx: RequestContext, params: types.ReadResourceRequestParams
) -> types.ReadResourceResult:
    """An artifact's contents (`text` for a text type that is UTF-8, else a base64 `blob`), or a task's output."""
    uri = params.uri
    output_of = split_output_uri(uri)
    if output_of is not None:
        text = await service.find_output(envelope.principal(ctx), output_of)
        if text is None:
            raise resource_not_found(ctx, uri)
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, mime_type=OUTPUT_MIME, text=text)]
        )
    parsed = parse_uri(uri)
    artifact = None if parsed is None else await service.find_artifact(envelope.principal(ctx), *parsed)
    if artifact is None:
        raise resource_not_found(ctx, uri)
    meta, limit = artifact.meta, service.settings.artifact_read_max_bytes
    if meta.size > limit:
        path = DOWNLOAD_PATH.format(task_id=artifact.task_id, name=meta.name)
        raise MCPError(
            _TOO_LARGE,
            f"artifact {meta.name!r} is {meta.size:,} bytes, over MCP_CELERY_ARTIFACT_READ_MAX_BYTES={limit:,}: "
            f"download it over HTTP, GET {path} with the same credentials (`mcp-celery tasks get ID --save DIR`)",
            {"uri": uri, "size": meta.size, "download": path},
        )
    try:
        data = await service.artifacts.read_all(artifact)
    except FileNotFoundError:
        raise resource_not_found(ctx, uri) from None
    return types.ReadResourceResult(contents=[_contents(uri, meta.mime_type, data, text=meta.is_text)])


def _contents(uri: str, mime_type: str, data: bytes, *, text: bool) -> Any:
    if text:
        try:
            return types.TextResourceContents(uri=uri, mime_type=mime_type, text=data.decode())
        except UnicodeDecodeError:
            pass
    return types.BlobResourceContents(uri=uri, mime_type=mime_type, blob=base64.b64encode(data).decode())


async def list_resources(
    service: TaskService, ctx: RequestContext, params: types.PaginatedRequestParams | None
) -> types.ListResourcesResult:
    """Nothing is listed: a task's artifacts are linked from its result (`resource_link`), not listed.
    Served so that the server declares the resources capability."""
    return types.ListResourcesResult(resources=[])
