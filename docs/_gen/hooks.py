"""MkDocs hook: the words that tell `tests/support/snippets.py` how a code block is checked leave its info string.

A fence such as ```` ```python check ```` or ```` ```sh run ```` renders on GitHub as it is (the
first word is the language), but SuperFences reads unknown words as options and gives up on the
fence. So the page's Markdown reaches MkDocs with the language alone; a `file=NAME` block gets
`title="NAME"`, so the site shows the file's name above it, and so does an `excerpt=PATH` block (the
file it quotes). Other options (`exit=N`) leave with the mode.
"""

from __future__ import annotations

import re
from typing import Any

#: A fence line with a language, then the mode and options of tests/support/snippets.py
#: (run, check, file=, excerpt=, exit=).
WORD = r"(?:run|check|(?:file|excerpt|exit)=\S+)"
FENCE = re.compile(rf"^(?P<fence>\s*(?:`{{3,}}|~{{3,}}))(?P<language>\w+)(?P<words>(?:\s+{WORD})+)\s*$")
#: The options whose value is a file's name, shown as the block's title.
TITLED = re.compile(r"\b(?:file|excerpt)=(\S+)")


def plain_fences(markdown: str) -> str:
    def plain(match: re.Match[str]) -> str:
        named = TITLED.search(match.group("words"))
        title = f' title="{named.group(1)}"' if named else ""
        return f"{match.group('fence')}{match.group('language')}{title}"

    return FENCE.sub(plain, markdown)


def on_page_markdown(markdown: str, **_: Any) -> str:
    return "\n".join(plain_fences(line) for line in markdown.split("\n"))
