"""The optional filters of a log search: a time window on each line's leading timestamp, and a level.

They run in Python on the lines the pattern already matched, so they cost nothing when unset.

A line's timestamp is the ISO 8601 date-time it starts with (optionally in brackets), with a
`T` or a space between date and time and a `.` or `,` before the fraction:
`2026-11-30T08:15:02.123Z`, `[2026-11-30 08:15:02,123]`. A timestamp without a zone is UTC.
A line's level is the first word after that timestamp when it is a level name (`ERROR`, `[error]`),
else the value of a `level=` field (`level=error`); case does not matter and `WARNING` counts as `WARN`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from jobs._logfiles import LogSearchError

__all__ = ["LineFilter", "parse_instant"]

_LEADING_TIMESTAMP = re.compile(
    r"\[?(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d{1,9})?)?(?:Z|[+-]\d{2}(?::?\d{2})?)?)\]?"
)
_FIRST_WORD = re.compile(r"[\s\[(<]*([A-Za-z]+)")
_LEVEL_FIELD = re.compile(r"\blevel=\"?([A-Za-z]+)", re.IGNORECASE)
_SYNONYMS = {"WARNING": "WARN"}
_KNOWN_LEVELS = frozenset(
    ["TRACE", "DEBUG", "INFO", "NOTICE", "WARN", "ERROR", "ERR", "CRITICAL", "CRIT", "FATAL", "PANIC", "ALERT", "EMERG"]
)


def parse_instant(value: str, what: str) -> datetime:
    """An ISO 8601 timestamp as an aware datetime (UTC when it names no zone).

    Raises:
        LogSearchError: `value` is not an ISO 8601 timestamp.
    """
    try:
        parsed = datetime.fromisoformat(value.strip().replace(",", "."))
    except ValueError:
        raise LogSearchError(f"{what} {value!r} is not an ISO 8601 timestamp, e.g. 2026-11-30T08:00:00Z") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _normal_level(word: str) -> str:
    upper = word.upper()
    return _SYNONYMS.get(upper, upper)


@dataclass(frozen=True)
class LineFilter:
    """Which matched lines count: inside [since, until] (both inclusive) and at `level`."""

    since: datetime | None = None
    until: datetime | None = None
    level: str | None = None

    @classmethod
    def build(cls, since: str | None, until: str | None, level: str | None) -> LineFilter:
        """Checked filters from the tool's arguments.

        Raises:
            LogSearchError: a bad timestamp, since after until, or a level that is not a word.
        """
        start = parse_instant(since, "since") if since else None
        end = parse_instant(until, "until") if until else None
        if start and end and start > end:
            raise LogSearchError(f"since ({since}) is after until ({until})")
        if level is not None and not re.fullmatch(r"[A-Za-z]+", level.strip()):
            raise LogSearchError(f"level {level!r} must be a single word such as ERROR")
        return cls(start, end, _normal_level(level.strip()) if level else None)

    @property
    def active(self) -> bool:
        return self.since is not None or self.until is not None or self.level is not None

    def accepts(self, line: str) -> bool:
        """True when `line` passes every filter that is set."""
        stamp = _LEADING_TIMESTAMP.match(line)
        if self.since or self.until:
            when = self._instant(stamp)
            if when is None or (self.since and when < self.since) or (self.until and when > self.until):
                return False
        return self.level is None or self._level_of(line, stamp.end() if stamp else 0) == self.level

    @staticmethod
    def _instant(stamp: re.Match[str] | None) -> datetime | None:
        if stamp is None:
            return None
        try:
            parsed = datetime.fromisoformat(stamp.group(1).replace(",", "."))
        except ValueError:
            return None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)

    @staticmethod
    def _level_of(line: str, start: int) -> str | None:
        """The first word after the timestamp if it is a level name, else a `level=` field's value."""
        word = _FIRST_WORD.match(line, start)
        first = _normal_level(word.group(1)) if word else None
        if first in _KNOWN_LEVELS:
            return first
        field = _LEVEL_FIELD.search(line)
        return _normal_level(field.group(1)) if field else first
