"""`mcp-celery tasks get ID --save DIR`: every artifact a task's result links, saved into a folder.

Client tier (mcp and httpx only). Over HTTP each artifact is streamed from the server's download
route, `GET /artifacts/{taskId}/{name}` beside the MCP endpoint, with the same bearer token, and its
SHA-256 is checked against the `Repr-Digest` the server sends. A stdio server has no HTTP route:
its artifacts come through `resources/read`, up to the server's MCP_CELERY_ARTIFACT_READ_MAX_BYTES.
A file is written under a temporary name and renamed once complete.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from mcp.client import Client
from mcp_types import BlobResourceContents, TextResourceContents

from mcp_celery.client._journal import ServerTarget
from mcp_celery.protocol import split_artifact_uri

__all__ = ["artifact_links", "download_url", "save_artifacts"]


def artifact_links(result: Mapping[str, Any] | None) -> list[tuple[str, str, str]]:
    """`(uri, task id, name)` of each artifact `resource_link` in a tool result."""
    found = []
    for block in (result or {}).get("content", []):
        if isinstance(block, Mapping) and block.get("type") == "resource_link":
            parts = split_artifact_uri(str(block.get("uri", "")))
            if parts is not None and _safe_file_name(parts[1]):
                found.append((str(block["uri"]), *parts))
    return found


def download_url(mcp_url: str, task_id: str, name: str) -> str:
    """The download route beside an MCP endpoint: `http://h:p/mcp` gives `http://h:p/artifacts/ID/NAME`."""
    base = mcp_url.rstrip("/").removesuffix("/mcp")
    return f"{base}/artifacts/{quote(task_id, safe='')}/{quote(name, safe='')}"


async def save_artifacts(
    result: Mapping[str, Any] | None, target: ServerTarget, token: str | None, folder: Path, client: Client
) -> list[Path]:
    """Save every artifact `result` links into `folder` (made if missing); the files written.

    Raises:
        httpx.HTTPStatusError: the server refused a download (e.g. 404 once the task expired).
        ValueError: a download's bytes do not match its checksum.
    """
    folder.mkdir(parents=True, exist_ok=True)
    saved = []
    for uri, task_id, name in artifact_links(result):
        path = folder / name
        partial = folder / f".{name}.partial"
        if target.url is not None:
            await _download(download_url(target.url, task_id, name), token, partial)
        else:
            partial.write_bytes(await _read(client, uri))
        os.replace(partial, path)
        saved.append(path)
    return saved


async def _download(url: str, token: str | None, partial: Path) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    digest = hashlib.sha256()
    async with httpx.AsyncClient(timeout=60) as http, http.stream("GET", url, headers=headers) as response:
        response.raise_for_status()
        with partial.open("wb") as out:
            async for chunk in response.aiter_bytes():
                digest.update(chunk)
                out.write(chunk)
        expected = response.headers.get("repr-digest", "")
    sent = f"sha-256=:{base64.b64encode(digest.digest()).decode()}:"
    if expected and expected != sent:
        partial.unlink(missing_ok=True)
        raise ValueError(f"{url}: the bytes received do not match the server's checksum ({expected})")


async def _read(client: Client, uri: str) -> bytes:
    contents = (await client.read_resource(uri)).contents
    data = b""
    for part in contents:
        if isinstance(part, TextResourceContents):
            data += part.text.encode()
        elif isinstance(part, BlobResourceContents):
            data += base64.b64decode(part.blob)
    return data


def _safe_file_name(name: str) -> bool:
    """A name that is one file in the folder (the server checks names too; a client trusts no server)."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name and name.isprintable()
