"""MkDocs hook: the words that tell `tests/snippets.py` how a code block is checked leave its info string.

A fence such as ```` ```python check ```` or ```` ```sh run ```` renders on GitHub as it is (the
first word is the language), but SuperFences reads unknown words as options and gives up on the
fence. So the page's Markdown reaches MkDocs with the language alone; a `file=NAME` block gets
`title="NAME"`, so the site shows the file's name above it.
"""

from __future__ import annotations

import re
from typing import Any

#: A fence line with a language and one of the modes of tests/snippets.py (run, check, file=NAME).
FENCE = re.compile(r"^(?P<fence>\s*(?:`{3,}|~{3,}))(?P<language>\w+)\s+(?:(?P<mode>run|check)|file=(?P<file>\S+))\s*$")


def plain_fences(markdown: str) -> str:
    def plain(match: re.Match[str]) -> str:
        title = f' title="{match.group("file")}"' if match.group("file") else ""
        return f"{match.group('fence')}{match.group('language')}{title}"

    return FENCE.sub(plain, markdown)


def on_page_markdown(markdown: str, **_: Any) -> str:
    return "\n".join(plain_fences(line) for line in markdown.split("\n"))
