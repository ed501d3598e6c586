"""The README and the docs: every code block either runs as written or is checked without running.

How each kind of block is checked: `tests/support/snippets.py`; how a page's blocks run:
`tests/support/snippet_scenario.py`. The names say which: `test_..._run_as_written` executes blocks (real
worker, real server, the suite's Redis), `test_..._without_running_them` only compiles and parses them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import redis
from celery import Celery

from mcp_celery.worker.config import recommended_settings
from tests.support.harness import ROOT, session_redis
from tests.support.snippet_code import message_in_code
from tests.support.snippet_scenario import Scenario
from tests.support.snippets import (
    Block,
    SnippetError,
    blocks,
    check_block,
    check_prose,
    known_files,
    pages,
    quoted_messages,
)

PAGES = pages()
CODE_BLOCKS = [block for page in PAGES for block in blocks(page) if block.is_code]
CHECKED = [block for block in CODE_BLOCKS if block.mode in {"check", "excerpt"}]
SCENARIO_PAGES = [page for page in PAGES if any(block.mode == "run" for block in blocks(page))]
#: The suite's Redis database for the pages' scenarios (emptied before each).
SCENARIO_DB = 15


def block_id(block: Block) -> str:
    return f"{block.where}:{block.language}"


def test_the_pages_have_code_to_check() -> None:
    assert "README.md" in PAGES and "README.md" in SCENARIO_PAGES
    assert len(CHECKED) >= 10 and len(SCENARIO_PAGES) >= 2


@pytest.mark.parametrize("block", CODE_BLOCKS, ids=block_id)
def test_every_code_block_says_how_it_is_checked(block: Block) -> None:
    assert block.mode is not None, f"{block.where}: a {block.language} block needs a mode (run, check, file=, excerpt=)"


@pytest.mark.parametrize("block", CHECKED, ids=block_id)
def test_checked_snippets_are_valid_without_running_them(block: Block) -> None:
    check_block(block, known_files(block.page))


@pytest.mark.parametrize("page", PAGES)
def test_the_prose_names_only_real_variables_commands_and_paths_without_running_them(page: str) -> None:
    assert check_prose(page) == []


@pytest.mark.venv
@pytest.mark.parametrize("page", SCENARIO_PAGES)
def test_the_snippets_of_the_page_run_as_written(page: str, env: dict[str, str], tmp_path: Path) -> None:
    url = session_redis(SCENARIO_DB)
    redis.Redis.from_url(url).flushdb()
    scenario = Scenario.for_page(page, tmp_path, env, url)
    try:
        for block in blocks(page):
            if block.mode not in {"file", "run"} or not block.is_code:
                continue
            check_block(block, known_files(page))  # parsed first: a typo fails here, not in a process
            if block.mode == "file":
                scenario.write(block)
            elif block.language in {"python", "py"}:
                scenario.run_python(block)
            elif block.language == "console":
                scenario.run_console(block)
            elif block.language == "json":
                scenario.run_host_config(block)
            else:
                scenario.run_shell(block)
    finally:
        scenario.stop()


def test_the_readme_lists_every_setting_configure_app_changes() -> None:
    text = (ROOT / "README.md").read_text()
    section = text.split("## What `configure_app` changes", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    listed = [name for row in rows for name in re.findall(r"`(\w+)`", row.split("|")[1])]
    applied = recommended_settings(Celery("readme", set_as_current=False))
    assert sorted(listed) == sorted(applied)


def test_the_readmes_where_to_read_on_links_every_guide() -> None:
    """The README is the entry point: a guide it does not name under "Where to read on" is one nobody finds."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Where to read on", 1)[1].split("\n## ", 1)[0]
    linked = set(re.findall(r"\]\(docs/guides/([^)#]+\.md)(?:#[^)]*)?\)", section))
    guides = {path.name for path in (ROOT / "docs" / "guides").glob("*.md")}
    assert sorted(guides - linked) == [], "guides the README's 'Where to read on' does not link"
    assert sorted(linked - guides) == [], "links to guides that do not exist"


def test_a_block_without_a_mode_fails_the_check() -> None:
    unmarked = Block("x.md", 1, "python", None, {}, "print('hi')\n")
    with pytest.raises(SnippetError, match="must say how it is checked"):
        check_block(unmarked)
    drifted = Block("x.md", 1, "sh", "check", {}, "mcp-celery serve --no-such-flag -A proj\n")
    with pytest.raises(SnippetError, match="unrecognized arguments"):
        check_block(drifted, frozenset({"proj.py"}))
    unknown = Block("x.md", 1, "sh", "check", {}, "MCP_CELERY_NO_SUCH_SETTING=1 mcp-celery demo\n")
    with pytest.raises(SnippetError, match="MCP_CELERY_NO_SUCH_SETTING"):
        check_block(unknown)


def test_a_run_block_with_exit_n_must_end_in_a_command_that_exits_n(env: dict[str, str], tmp_path: Path) -> None:
    scenario = Scenario(tmp_path, env)
    fails = "python -c \"import sys; print('mcp-celery: no'); sys.exit(2)\"\n"
    scenario.run_shell(Block("x.md", 1, "sh", "run", {"exit": "2"}, f"python -c pass\n{fails}"))
    scenario.run_console(Block("x.md", 1, "console", "run", {"exit": "2"}, f"$ {fails}mcp-celery: no\n"))
    with pytest.raises(SnippetError, match="exited 2, not 0"):
        scenario.run_shell(Block("x.md", 1, "sh", "run", {}, fails))
    with pytest.raises(SnippetError, match="exited 2, not 0"):  # only the last command may fail
        scenario.run_shell(Block("x.md", 1, "sh", "run", {"exit": "2"}, f"{fails}python -c pass\n"))
    with pytest.raises(SnippetError, match="exited 0, not 2"):
        scenario.run_shell(Block("x.md", 1, "sh", "run", {"exit": "2"}, "python -c pass\n"))
    with pytest.raises(SnippetError, match="only a python, sh or console block that runs"):
        check_block(Block("x.md", 1, "console", "check", {"exit": "2"}, f"$ {fails}"))
    with pytest.raises(SnippetError, match="not an exit status"):
        check_block(Block("x.md", 1, "sh", "run", {"exit": "two"}, fails))


def test_an_excerpt_must_quote_its_file_in_order() -> None:
    quoted = "def train_sweep(\n    ...  # its parameters\n) -> SweepResult:\n"
    check_block(Block("x.md", 1, "python", "excerpt", {"excerpt": "jobs/sweep.py"}, quoted))
    drifted = "def train_sweep(ctx, grid) -> SweepResult:\n"
    with pytest.raises(SnippetError, match="is not one of its lines"):
        check_block(Block("x.md", 1, "python", "excerpt", {"excerpt": "jobs/sweep.py"}, drifted))
    backwards = ") -> SweepResult:\ndef train_sweep(\n"
    with pytest.raises(SnippetError, match="after the ones before it"):
        check_block(Block("x.md", 1, "python", "excerpt", {"excerpt": "jobs/sweep.py"}, backwards))
    with pytest.raises(SnippetError, match="not a file of the repository"):
        check_block(Block("x.md", 1, "python", "excerpt", {"excerpt": "jobs/no_such.py"}, quoted))


def test_a_quoted_message_must_be_one_the_code_writes_whole() -> None:
    assert message_in_code("the worker running the job was lost: no heartbeat since ...")
    assert message_in_code("the job lost its worker 4 times; it is not run again (retry_on_worker_loss)")
    # As the README once quoted it: the start of the message only.
    assert not message_in_code("the worker running the job was lost, and the job's message with it")
    assert quoted_messages('ends "the job lost its\nworker 4 times; it is not run again (x)" and "the short one"') == [
        "the job lost its worker 4 times; it is not run again (x)"
    ]
