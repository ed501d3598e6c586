"""A release that a second person approves: build, ask on the approval page, then publish.

`release(version)` builds an artifact (byte-compiles mcp-celery's own sources and packs them into a
tar.gz: a few seconds of real work, done once however often the job runs again), asks for approval
with the artifact's SHA-256 in the details, and publishes it (copies it into RELEASE_PUBLISH_DIR,
default `releases/` under the working directory) only when approved. The approvers are
RELEASE_APPROVERS (comma-separated principals; unset: anyone signed in), and the four-eyes rule
holds: whoever asked never approves their own release. The question parks (`park_after_s`), so a
release waiting all night holds no worker.

Needs MCP_CELERY_PUBLIC_URL on the worker (the approval page's link) and `mcp-celery serve --http`
with authentication (the page signs approvers in with their own tokens).

Job code (worker tier). It ships inside the package so that `mcp-celery demo` runs it from a plain
install (its step 6); `jobs.release` is the same module under the real jobs' name.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import py_compile
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from celery import Celery
from typing_extensions import TypedDict

import mcp_celery

__all__ = ["ReleaseReport", "build", "register"]

#: What the release packs: the installed mcp_celery package's sources.
SOURCES = Path(mcp_celery.__file__).parent


class ReleaseReport(TypedDict):
    version: str
    digest: str
    bytes: int
    decision: str
    published: str | None


def build(version: str, into: Path, rounds: int = 2) -> dict[str, Any]:
    """Byte-compile the sources `rounds` times over (optimisation levels 0 and 1) and pack them: the artifact."""
    into.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="release-", dir=into))
    for source in sorted(SOURCES.rglob("*.py")):
        relative = source.relative_to(SOURCES)
        for level in range(rounds):
            target = staging / f"opt{level}" / relative.with_suffix(".pyc")
            py_compile.compile(str(source), cfile=str(target), doraise=True, optimize=level)
    artifact = into / f"mcp-celery-{version}.tar.gz"
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as gzipped, tarfile.open(fileobj=gzipped, mode="w") as tar:
        for path in sorted(p for p in staging.rglob("*") if p.is_file()):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(staging)))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""  # reproducible
            with path.open("rb") as data:
                tar.addfile(info, data)
    shutil.rmtree(staging)
    packed = buffer.getvalue()
    artifact.write_bytes(packed)
    return {"path": str(artifact), "digest": hashlib.sha256(packed).hexdigest(), "bytes": len(packed)}


def _approvers() -> list[str] | None:
    names = [name.strip() for name in os.environ.get("RELEASE_APPROVERS", "").split(",") if name.strip()]
    return names or None


def register(app: Celery, **options: Any) -> None:
    """Add the `release` tool to `app` (`options`: the tool's own, e.g. `park_after_s=0`)."""

    @mcp_celery.tool(app, task_mode="required", **options)
    def release(ctx: mcp_celery.JobContext, version: str = "1.0.0") -> ReleaseReport:
        """Build a release of mcp-celery, have a second person approve it, then publish it."""
        ctx.status(f"building {version}")
        work = Path(os.environ.get("RELEASE_WORK_DIR") or Path(tempfile.gettempdir()) / "mcp-celery-release")
        built = ctx.once("build", lambda: build(version, work / ctx.task_id))
        details = {"version": version, "sha256": built["digest"], "bytes": built["bytes"]}
        decided = ctx.approve(f"Publish mcp-celery {version}?", approvers=_approvers(), details=details, four_eyes=True)
        published = None
        if decided.approved:
            ctx.status("publishing")
            folder = Path(os.environ.get("RELEASE_PUBLISH_DIR") or "releases")
            folder.mkdir(parents=True, exist_ok=True)
            published = str(shutil.copy2(built["path"], folder / Path(built["path"]).name))
        return {
            "version": version,
            "digest": built["digest"],
            "bytes": built["bytes"],
            "decision": str(decided),
            "published": published,
        }
