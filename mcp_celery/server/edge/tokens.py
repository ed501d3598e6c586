"""Static bearer tokens: the token file's format, `mcp-celery token new` and `mcp-celery token revoke`.

Tier 0 (standard library only), so that `mcp-celery token new` loads neither the server nor
Celery. The file holds one `PRINCIPAL sha256:HEXDIGEST` line per token, never a token itself;
the server's verifier (`mcp_celery.server.edge.auth`) reads it.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import tempfile
from pathlib import Path

from mcp_celery.errors import ConfigurationError

__all__ = ["hash_token", "new_token", "parse_token_file", "revoke_tokens"]

_PRINCIPAL = re.compile(r"^[^\s#]{1,200}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def hash_token(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def parse_token_file(text: str) -> list[tuple[str, bytes]]:
    """`PRINCIPAL sha256:HEX` lines; `#` starts a comment. Raises ConfigurationError naming a bad line."""
    entries = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not _PRINCIPAL.match(parts[0]) or not _DIGEST.match(parts[1]):
            raise ConfigurationError(f"token file line {number}: expected 'PRINCIPAL sha256:<64 hex digits>'")
        entries.append((parts[0], parts[1].encode()))
    return entries


def new_token(principal: str, path: Path) -> str:
    """A fresh random token (256 bits) for `principal`; only its digest is appended to `path`.

    The file and any missing folders above it are created, readable by their owner only.

    Raises:
        ConfigurationError: a bad principal name, a file the server could not read, or a path that
            cannot be written (the message names it and says why).
    """
    if not _PRINCIPAL.match(principal):
        raise ConfigurationError(f"bad principal name {principal!r}: no spaces or '#', at most 200 characters")
    try:
        if path.exists():
            parse_token_file(path.read_text())  # refuse to append to a file the server could not read
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        except FileExistsError:  # its strerror, "File exists", would not say which or why
            raise ConfigurationError(f"cannot write the token file {path}: {path.parent} is a file") from None
        token = secrets.token_urlsafe(32)
        while token.startswith("-"):  # one in 64 would read as an option: `mcp-celery call --token -x...`
            token = secrets.token_urlsafe(32)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as out:
            out.write(f"{principal} {hash_token(token)}\n")
    except OSError as exc:
        raise ConfigurationError(f"cannot write the token file {path}: {exc.strerror or exc}") from exc
    return token


def revoke_tokens(principal: str, path: Path) -> int:
    """Remove every token of `principal` from the file; returns how many lines went.

    The file is replaced at once (written beside it, then renamed over it, still readable by its
    owner only), so a server never reads half of it; servers re-read it on their next check, which
    ends the principal's sessions on the approval page at their next request.

    Raises:
        ConfigurationError: no token of `principal` in the file, or a file that cannot be read,
            parsed or replaced (the message names it and says why).
    """
    try:
        lines = path.read_text().splitlines(keepends=True)
        parse_token_file("".join(lines))  # refuse to rewrite a file the server could not read
        kept = [line for line in lines if line.split("#", 1)[0].split()[:1] != [principal]]
        removed = len(lines) - len(kept)
        if not removed:
            raise ConfigurationError(f"no token of {principal!r} in {path}")
        fd, staged = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mode 0600
        with os.fdopen(fd, "w") as out:
            out.writelines(kept)
        os.replace(staged, path)
    except OSError as exc:
        raise ConfigurationError(f"cannot rewrite the token file {path}: {exc.strerror or exc}") from exc
    return removed
