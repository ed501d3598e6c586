"""A durable local journal of the tasks this user started, in SQLite (stdlib only).

The extension has no `tasks/list`: a task id the client forgets is lost. So the handle writes the id, the
server target, the tool, its arguments and the call's idempotency key here *before* it is returned, and
records each status it sees.
A client that crashed, or a user who closed the terminal, lists the journal and resumes any task.

Default path: `$MCP_CELERY_CLIENT_JOURNAL`, else `$XDG_DATA_HOME/mcp-celery/tasks.db` (`~/.local/share/...`).
Bearer tokens are never stored: resuming an HTTP task that needs one takes the token again.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["JOURNAL_ENV", "Journal", "JournalEntry", "ServerTarget", "default_journal_path"]

JOURNAL_ENV = "MCP_CELERY_CLIENT_JOURNAL"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    task_id        TEXT PRIMARY KEY,
    target         TEXT NOT NULL,
    tool           TEXT NOT NULL,
    arguments      TEXT,
    created_at     TEXT NOT NULL,
    status         TEXT NOT NULL,
    status_message TEXT,
    updated_at     TEXT NOT NULL,
    idempotency_key TEXT
)
"""
#: Journals written before the key was kept gain its column when opened.
_ADD_KEY = "ALTER TABLE tasks ADD COLUMN idempotency_key TEXT"
_COLUMNS = "task_id, target, tool, arguments, created_at, status, status_message, updated_at, idempotency_key"


@dataclass(frozen=True)
class ServerTarget:
    """Where a task lives: a Streamable HTTP URL, or a stdio command (run from `cwd`)."""

    url: str | None = None
    command: tuple[str, ...] = ()
    cwd: str | None = None

    def __post_init__(self) -> None:
        if (self.url is None) == (not self.command):
            raise ValueError("a ServerTarget is either a url or a stdio command, exactly one of them")

    def to_json(self) -> str:
        if self.url is not None:
            return json.dumps({"url": self.url})
        return json.dumps({"command": list(self.command), "cwd": self.cwd})

    @classmethod
    def from_json(cls, text: str) -> ServerTarget:
        data = json.loads(text)
        if "url" in data:
            return cls(url=data["url"])
        return cls(command=tuple(data["command"]), cwd=data.get("cwd"))

    def describe(self) -> str:
        return self.url if self.url is not None else " ".join(self.command)


@dataclass(frozen=True)
class JournalEntry:
    task_id: str
    target: ServerTarget
    tool: str
    arguments: dict[str, Any] | None
    created_at: str
    status: str
    status_message: str | None
    updated_at: str
    #: The key the call was sent with (a repeat with it gets this task); None when the client did not know it.
    idempotency_key: str | None = None


def default_journal_path() -> Path:
    if configured := os.environ.get(JOURNAL_ENV):
        return Path(configured)
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "mcp-celery" / "tasks.db"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class Journal:
    """The task journal at `path` (default: `default_journal_path()`). Each call opens its own connection,
    so a journal object is safe to share and several client processes can write the same file."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else default_journal_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.execute(_SCHEMA)
            if "idempotency_key" not in {row[1] for row in db.execute("PRAGMA table_info(tasks)")}:
                db.execute(_ADD_KEY)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        with closing(sqlite3.connect(self.path, timeout=10)) as db, db:  # `with db` commits or rolls back
            yield db

    def record(
        self,
        task_id: str,
        target: ServerTarget,
        tool: str,
        arguments: dict[str, Any] | None,
        status: str,
        idempotency_key: str | None = None,
    ) -> None:
        """Write a new task; committed (fsynced by SQLite) when this returns."""
        now = _now()
        with self._connect() as db:
            db.execute(
                f"INSERT OR REPLACE INTO tasks ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, NULL, ?, ?)",
                (task_id, target.to_json(), tool, json.dumps(arguments), now, status, now, idempotency_key),
            )

    def update_status(self, task_id: str, status: str, status_message: str | None) -> None:
        with self._connect() as db:
            db.execute(
                "UPDATE tasks SET status = ?, status_message = ?, updated_at = ? WHERE task_id = ?",
                (status, status_message, _now(), task_id),
            )

    def get(self, task_id: str) -> JournalEntry:
        """The entry for `task_id`, or for the one id that starts with it.

        Raises:
            KeyError: no entry, or the prefix is ambiguous (the message says which).
        """
        with self._connect() as db:
            rows = db.execute(
                f"SELECT {_COLUMNS} FROM tasks WHERE task_id = ? OR substr(task_id, 1, length(?)) = ? LIMIT 3",
                (task_id, task_id, task_id),
            ).fetchall()
        exact = [row for row in rows if row[0] == task_id]
        if exact or len(rows) == 1:
            return _entry((exact or rows)[0])
        raise KeyError(f"{'several tasks start with' if rows else 'no task'} {task_id!r} in {self.path}")

    def entries(self, limit: int = 50) -> list[JournalEntry]:
        """The newest `limit` entries, newest first."""
        with self._connect() as db:
            query = f"SELECT {_COLUMNS} FROM tasks ORDER BY created_at DESC, rowid DESC LIMIT ?"
            rows = db.execute(query, (limit,)).fetchall()
        return [_entry(row) for row in rows]


def _entry(row: tuple[Any, ...]) -> JournalEntry:
    task_id, target, tool, arguments, created_at, status, status_message, updated_at, key = row
    return JournalEntry(
        task_id=task_id,
        target=ServerTarget.from_json(target),
        tool=tool,
        arguments=json.loads(arguments) if arguments is not None else None,
        created_at=created_at,
        status=status,
        status_message=status_message,
        updated_at=updated_at,
        idempotency_key=key,
    )
