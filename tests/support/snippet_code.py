"""What the repository's code knows, for the checks of `tests/support/snippets.py`: its settings, the variables
and strings it reads and writes, its modules, extras and paths.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import tomllib
from functools import cache
from pathlib import Path

from mcp_celery.settings import Settings
from tests.support.harness import ROOT

__all__ = [
    "code_strings",
    "code_text",
    "extras",
    "message_in_code",
    "module_exists",
    "path_exists",
    "repo_path",
    "settings_variables",
    "variable_known",
]

#: Files whose text is not evidence that the code reads a variable (the docs, and these checks).
NOT_CODE = (
    "docs/",
    "tests/support/snippets.py",
    "tests/support/snippet_code.py",
    "tests/docs/test_docs.py",
    "README.md",
    "bench/results",
)
TOP_LEVEL_FILES = {"docker-compose.yml", "Dockerfile", "pyproject.toml", "mkdocs.yml", "README.md"}
REPO_DIRS = ("mcp_celery/", "jobs/", "tests/", "bench/", "docs/", ".ci/")
#: Modules `python -m` may name besides the repository's own.
THIRD_PARTY_MODULES = {"pytest", "venv", "pip", "celery", "mkdocs"}


@cache
def settings_variables() -> frozenset[str]:
    return frozenset(f"MCP_CELERY_{name.upper()}" for name in Settings.model_fields)


#: Folders that are not the repository's own code: caches, virtualenvs, installed packages, a built site.
SKIPPED_FOLDERS = {"node_modules", "site", "__pycache__"}


@cache
def code_files() -> tuple[Path, ...]:
    """The repository's code and configuration files, the docs and these checks excluded."""
    found = []
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = sorted(d for d in subfolders if not d.startswith(".") or d == ".ci")
        subfolders[:] = [d for d in subfolders if d not in SKIPPED_FOLDERS]
        for name in sorted(files):
            path = Path(folder) / name
            if str(path.relative_to(ROOT)).startswith(NOT_CODE):
                continue
            if path.suffix in {".py", ".sh", ".toml", ".yml", ".yaml"} or name in {"Dockerfile", "run"}:
                found.append(path)
    return tuple(found)


@cache
def code_text() -> str:
    """The text of the repository's code and configuration, the docs excluded."""
    return "\n".join(path.read_text(errors="replace") for path in code_files())


def variable_known(name: str) -> bool:
    return name in settings_variables() or re.search(rf"\b{re.escape(name)}\b", code_text()) is not None


@cache
def extras() -> frozenset[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return frozenset(project["optional-dependencies"])


def repo_path(text: str) -> bool:
    """Whether `text` reads as a path inside the repository (then it must exist)."""
    return (text.startswith(REPO_DIRS) or text in TOP_LEVEL_FILES) and re.fullmatch(r"[\w./-]+", text) is not None


def module_exists(name: str, page_files: frozenset[str] = frozenset()) -> bool:
    """Whether `name` is importable here, a file of the page, or a placeholder in capitals (`MODULE`)."""
    top = name.split(".")[0]
    if top.isupper():
        return True
    if f"{top}.py" in page_files or any(f.startswith(f"{top}/") for f in page_files):
        return True
    if top in THIRD_PARTY_MODULES:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def message_in_code(quote: str) -> bool:
    """Whether the code has a string that is `quote` whole: `...` in it stands for a value filled in, and
    a number may be a `{field}` of the code's string."""

    def word(text: str) -> str:
        if text.isdigit():
            return rf"(?:{text}|\{{[^}}]*\}})"
        return re.escape(text).replace(re.escape("..."), ".+?")

    pattern = re.compile(r"\s+".join(word(w) for w in quote.split()))
    return any(pattern.fullmatch(" ".join(string.split())) for string in code_strings())


@cache
def code_strings() -> frozenset[str]:
    """Every string the repository's Python code writes (an f-string with `{}` for each value)."""
    found: set[str] = set()
    for path in (p for p in code_files() if p.suffix == ".py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.add(node.value)
            elif isinstance(node, ast.JoinedStr):
                found.add("".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values))
    return frozenset(found)


def path_exists(path: str) -> bool:
    """In the repository, or a path it ignores on purpose (made by a run: `bench/.logs/`, a virtualenv)."""
    if (ROOT / path).exists():
        return True
    candidates = [path, path.rstrip("/") + "/"]
    return any(
        subprocess.run(["git", "check-ignore", "-q", "--no-index", c], cwd=ROOT, check=False).returncode == 0
        for c in candidates
    )
