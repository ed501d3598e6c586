"""Duplicate blocks: runs of six or more lines that repeat, the same or the same shape with other names.

Each file becomes a list of significant lines (blank lines, comment-only lines, lone strings such
as one-line docstrings, and imports are left out, so they neither make nor break a duplicate) in
two forms: the text with its spacing collapsed, and its shape, where every identifier that is not
a keyword becomes `N`, every string `S` and every number `0`. Every window of `min_lines`
consecutive shapes is indexed; two places whose windows match, and whose previous lines do not,
start a duplicate, which is then extended for as long as the shapes go on matching. Places that
share the same block are one duplicate with several occurrences; it is `exact` when the texts
match too, else `renamed`.

Language-agnostic on purpose (a token is a word, a number, a quoted string or one other
character), so the same finder serves Python, JavaScript, Go or SQL. Blocks made mostly of
short lines (closing brackets, `else:`, `pass`) are not reported.
"""

from __future__ import annotations

import keyword
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, NamedTuple

__all__ = ["MIN_LINES", "Duplicate", "Occurrence", "find_duplicates", "significant_lines"]

MIN_LINES = 6
MAX_PLACES_PER_WINDOW = 40  # a window repeated more often than this is boilerplate; its first places suffice
SUBSTANTIAL_TOKENS = 4  # a line with fewer tokens (`)`, `else:`) does not count towards a block's substance
_TOKEN = re.compile(
    r'"""(?:.*?""")?|'
    r"'''(?:.*?''')?|"  # a triple-quoted string, or where one opens or closes
    r"""[A-Za-z_$][\w$]*|\d[\w.]*|"(?:[^"\\]|\\.)*"?|'(?:[^'\\]|\\.)*'?|`[^`]*`?|\S"""
)
_COMMENT = re.compile(r"^(#|//|/\*|\*|--|;)")
_IMPORT = re.compile(r"^(import\s|from\s+\S+\s+import\s|#include\s|using\s|use\s|require\(|package\s)")
# Words that carry a block's shape in the usual languages: kept as they are, never renamed.
KEYWORDS = frozenset(keyword.kwlist) | frozenset(keyword.softkwlist) | {
    "self", "cls", "this", "super", "function", "var", "let", "const", "new", "typeof", "instanceof", "void",
    "null", "undefined", "true", "false", "nil", "func", "go", "defer", "chan", "select", "switch", "case",
    "default", "struct", "interface", "type", "impl", "fn", "mut", "pub", "enum", "match", "throw", "throws",
    "catch", "extends", "implements", "static", "public", "private", "protected", "final", "do", "until",
}  # fmt: skip


class Line(NamedTuple):
    number: int  # 1-based, in the file
    text: str  # spacing collapsed
    shape: str
    tokens: int


@dataclass(frozen=True)
class Occurrence:
    file: str
    start_line: int
    end_line: int


@dataclass(frozen=True)
class Duplicate:
    """One block found in several places; `lines` counts its significant lines."""

    lines: int
    kind: Literal["exact", "renamed"]
    occurrences: tuple[Occurrence, ...]
    preview: str  # its first lines, as in the first occurrence


def significant_lines(text: str) -> list[Line]:
    """The lines that take part in duplicates, with their text and shape."""
    found: list[Line] = []
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped or _COMMENT.match(stripped) or _IMPORT.match(stripped):
            continue
        tokens = _TOKEN.findall(stripped)
        if len(tokens) == 1 and _shape(tokens[0]) == "S":
            continue  # a lone string: a docstring's line, as good as a comment
        found.append(Line(number, " ".join(stripped.split()), " ".join(_shape(t) for t in tokens), len(tokens)))
    return found


def _shape(token: str) -> str:
    first = token[0]
    if first.isalpha() or first in "_$":
        return token if token in KEYWORDS else "N"
    if first.isdigit():
        return "0"
    if first in "\"'`":
        return "S"
    return token


def find_duplicates(
    sources: Mapping[str, str],
    min_lines: int = MIN_LINES,
    *,
    tick: Callable[[], None] | None = None,
    limit: int = 100,
) -> list[Duplicate]:
    """The duplicate blocks of at least `min_lines` significant lines in `sources` (name → text), largest first.

    `tick()` runs once per file and once per batch of candidate places: a cancel checkpoint.
    """
    if min_lines < 2:
        raise ValueError("min_lines must be at least 2")
    tick = tick or (lambda: None)
    files: dict[str, list[Line]] = {}
    for name, text in sources.items():
        tick()
        files[name] = significant_lines(text)
    places: dict[tuple[str, ...], list[tuple[str, int]]] = defaultdict(list)
    for name, lines in files.items():
        shapes = tuple(line.shape for line in lines)
        for start in range(len(lines) - min_lines + 1):
            bucket = places[shapes[start : start + min_lines]]
            if len(bucket) < MAX_PLACES_PER_WINDOW:
                bucket.append((name, start))
    pairs = _pairs(files, places.values(), min_lines, tick)
    return _group(files, pairs, min_lines)[:limit]


_Place = tuple[str, int]


def _pairs(
    files: Mapping[str, list[Line]], buckets: Iterable[list[_Place]], min_lines: int, tick: Callable[[], None]
) -> list[tuple[_Place, _Place, int]]:
    """Every maximal matching run between two places: (place a, place b, length in lines)."""
    found = []
    for count, bucket in enumerate(buckets):
        if count % 4096 == 0:
            tick()
        for i, a in enumerate(bucket):
            for b in bucket[i + 1 :]:
                if _overlap(a, b, min_lines) or _continues(files, a, b):
                    continue  # the run started earlier: found from its first window
                found.append((a, b, _extend(files, a, b, min_lines)))
    return found


def _overlap(a: _Place, b: _Place, length: int) -> bool:
    return a[0] == b[0] and abs(a[1] - b[1]) < length


def _continues(files: Mapping[str, list[Line]], a: _Place, b: _Place) -> bool:
    """Whether the lines before both places match too, so the run begins earlier (places that overlap are out)."""
    if a[1] == 0 or b[1] == 0:
        return False
    return files[a[0]][a[1] - 1].shape == files[b[0]][b[1] - 1].shape


def _extend(files: Mapping[str, list[Line]], a: _Place, b: _Place, length: int) -> int:
    lines_a, lines_b = files[a[0]], files[b[0]]
    while (
        a[1] + length < len(lines_a)
        and b[1] + length < len(lines_b)
        and lines_a[a[1] + length].shape == lines_b[b[1] + length].shape
        and not (a[0] == b[0] and min(a[1], b[1]) + length >= max(a[1], b[1]))  # one run must end before the other
    ):
        length += 1
    return length


def _group(files: Mapping[str, list[Line]], pairs: list[tuple[_Place, _Place, int]], min_lines: int) -> list[Duplicate]:
    """Pairs of the same block joined into one duplicate per block (union-find over (place, length))."""
    parent: dict[tuple[str, int, int], tuple[str, int, int]] = {}

    def root(node: tuple[str, int, int]) -> tuple[str, int, int]:
        parent.setdefault(node, node)
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    for a, b, length in pairs:
        parent[root((*a, length))] = root((*b, length))
    classes: dict[tuple[str, int, int], list[tuple[str, int, int]]] = defaultdict(list)
    for node in parent:
        classes[root(node)].append(node)
    duplicates = []
    for members in classes.values():
        members.sort()
        first_name, first_start, length = members[0]
        block = files[first_name][first_start : first_start + length]
        if sum(line.tokens >= SUBSTANTIAL_TOKENS for line in block) < (min_lines + 1) // 2:
            continue
        texts = {tuple(line.text for line in files[name][start : start + length]) for name, start, _ in members}
        occurrences = tuple(
            Occurrence(name, files[name][start].number, files[name][start + length - 1].number)
            for name, start, _ in members
        )
        preview = "\n".join(line.text for line in block[:3])
        duplicates.append(Duplicate(length, "exact" if len(texts) == 1 else "renamed", occurrences, preview))
    duplicates.sort(key=lambda d: (-d.lines * len(d.occurrences), d.occurrences))
    return duplicates
