"""A task's live output (`ctx.output`): what is kept of it, and how a reader sees it.

Tier 1, pure. The output is one string key beside the record (`Keys.output`), appended to by one
script (`scripts.OUTPUT_APPEND`); the record counts the bytes dropped from its head
(`FIELD.OUTPUT_DROPPED`). Only the last MCP_CELERY_OUTPUT_KEEP_BYTES are kept, but cutting a
string's head means copying the rest, so the script lets the output grow by a slack before it cuts
it back: one copy per slack's worth of text, not one per line. Readers cut the slack off themselves
(`render`), so every reader sees at most the bytes kept, starting on a whole character, after a
first line that says how many bytes were dropped (`protocol.OUTPUT_DROPPED_LINE`).
"""

from __future__ import annotations

from mcp_celery.protocol import OUTPUT_DROPPED_LINE

__all__ = ["clip", "last_lines", "render", "slack"]

#: The least slack: small kept sizes still cut back only every few kilobytes.
MIN_SLACK = 4096


def slack(keep: int) -> int:
    """How far past `keep` bytes the stored output may grow before the script cuts it back."""
    return max(keep // 8, MIN_SLACK)


def clip(data: bytes, keep: int) -> tuple[bytes, int]:
    """`data` without the head that `keep` bytes cannot hold, and how many bytes that head had."""
    return (data, 0) if len(data) <= keep else (data[-keep:], len(data) - keep)


def render(dropped: int, data: bytes, keep: int) -> str:
    """The output as `resources/read` returns it: the last `keep` bytes, after the dropped-bytes line."""
    data, cut = clip(data, keep)
    dropped += cut
    if dropped:
        start = 0
        while start < min(len(data), 3) and data[start] & 0xC0 == 0x80:  # a UTF-8 continuation byte
            start += 1
        data, dropped = data[start:], dropped + start
    text = data.decode(errors="replace")
    return OUTPUT_DROPPED_LINE.format(dropped=dropped, kept=len(data)) + text if dropped else text


def last_lines(text: str, count: int = 5, width: int = 200) -> list[str]:
    """The last `count` non-empty lines of `text`, each cut to `width` characters (a bounded glimpse)."""
    lines = [line for line in text.splitlines()[-count - 1 :] if line.strip()][-count:]
    return [line if len(line) <= width else line[: width - 1] + "…" for line in lines]
