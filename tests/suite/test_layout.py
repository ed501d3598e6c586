"""The layout of `tests/`: its folders mirror the package, and whatever is not a test lives in `tests/support/`.

A new test goes in the folder of what it tests (docs/development.md, "Where a new test goes"). Each
check below is a function of a tests folder that lists what is out of place; it runs on the real
folder, and on a small tree of the same shape with one thing put out of place, to show it can fail.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.harness import ROOT

#: The test folders that mirror a part of the repository: the package's modules, the example jobs,
#: the benchmark and the docs.
MIRRORS = {
    "core": "mcp_celery/core",
    "store": "mcp_celery/store",
    "worker": "mcp_celery/worker",
    "client": "mcp_celery/client",
    "cli": "mcp_celery/cli",
    "server": "mcp_celery/server",
    "server/tasks": "mcp_celery/server/tasks",
    "server/engine": "mcp_celery/server/engine",
    "server/plain": "mcp_celery/server/plain",
    "server/edge": "mcp_celery/server/edge",
    "server/approvals": "mcp_celery/server/approvals",
    "server/ops": "mcp_celery/server/ops",
    "jobs": "jobs",
    "bench": "bench",
    "docs": "docs",
}
#: The test folders of a concern no one module holds.
CONCERNS = {
    "e2e": "the whole system at once: chaos, the demo, the deployment, restarts, failover, scale-out",
    "package": "checks across the package: layering, exports, wire models, settings, logs, tracing",
    "suite": "the suite's own rules and this layout",
}
#: Where every helper goes: fixtures, job apps, fake servers, scripts and data.
SUPPORT = "support"
#: The only files at the root of tests/.
ROOT_FILES = {"__init__.py", "conftest.py"}

TESTS = ROOT / "tests"


def _skipped(path: Path) -> bool:
    """Caches, virtualenvs and node packages: made by runs, not part of the layout."""
    return any(part.startswith(".") or part in {"__pycache__", "node_modules"} for part in path.parts)


def _test_folders(tests: Path) -> list[Path]:
    """Every folder under `tests` but the support package."""
    return sorted(
        path
        for path in tests.rglob("*")
        if path.is_dir() and not _skipped(path.relative_to(tests)) and path.relative_to(tests).parts[0] != SUPPORT
    )


def _is_test_file(path: Path) -> bool:
    return path.suffix == ".py" and path.name.startswith("test_")


def root_tests(tests: Path) -> list[str]:
    return [
        f"tests/{path.name}: a test file at the root; it goes in the folder of what it tests"
        for path in sorted(tests.iterdir())
        if _is_test_file(path)
    ]


def other_files_at_the_root(tests: Path) -> list[str]:
    return [
        f"tests/{path.name}: only {sorted(ROOT_FILES)} sit at the root; helpers and data go in tests/{SUPPORT}/"
        for path in sorted(tests.iterdir())
        if path.is_file() and path.name not in ROOT_FILES and not _is_test_file(path)
    ]


def helpers_outside_support(tests: Path) -> list[str]:
    return [
        f"{path.relative_to(tests.parent)}: not a test; helpers go in tests/{SUPPORT}/"
        for folder in _test_folders(tests)
        for path in sorted(folder.iterdir())
        if path.is_file() and not _is_test_file(path) and path.name != "__init__.py"
    ]


def folders_without_a_counterpart(tests: Path) -> list[str]:
    known = set(MIRRORS) | set(CONCERNS)
    return [
        f"{folder.relative_to(tests.parent)}: no such test folder in tests/suite/test_layout.py (MIRRORS, CONCERNS)"
        for folder in _test_folders(tests)
        if folder.relative_to(tests).as_posix() not in known
    ]


def counterparts_gone(tests: Path) -> list[str]:
    return [
        f"tests/{folder}: mirrors {target}, which is not in the repository"
        for folder, target in MIRRORS.items()
        if not (tests.parent / target).is_dir()
    ]


def folders_missing(tests: Path) -> list[str]:
    return [
        f"tests/{folder}: a folder of the layout is missing"
        for folder in [*MIRRORS, *CONCERNS, SUPPORT]
        if not (tests / folder).is_dir()
    ]


def packages_without_init(tests: Path) -> list[str]:
    """Test folders, and support folders with Python files, are packages: tests.<folder>.test_x names stay unique."""
    support = tests / SUPPORT
    folders = _test_folders(tests) + [
        path
        for path in [support, *support.rglob("*")]
        if path.is_dir() and not _skipped(path.relative_to(tests)) and any(path.glob("*.py"))
    ]
    return [
        f"{folder.relative_to(tests.parent)}: no __init__.py"
        for folder in folders
        if not (folder / "__init__.py").is_file()
    ]


def support_tests(tests: Path) -> list[str]:
    return [
        f"{path.relative_to(tests.parent)}: a test file in tests/{SUPPORT}/; it goes in the folder of what it tests"
        for path in sorted((tests / SUPPORT).rglob("test_*.py"))
        if not _skipped(path.relative_to(tests))
    ]


def imports_of_test_files(tests: Path) -> list[str]:
    """A helper two test files share lives in tests/support/, never in one of them."""
    found = []
    for path in sorted(tests.rglob("*.py")):
        if _skipped(path.relative_to(tests)):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            found += [
                f"{path.relative_to(tests.parent)}: imports {name}; shared helpers go in tests/{SUPPORT}/"
                for name in names
                if name.startswith("tests.") and name.rsplit(".", 1)[-1].startswith("test_")
            ]
    return found


def support_init_is_a_docstring(tests: Path) -> list[str]:
    init = tests / SUPPORT / "__init__.py"
    if not init.is_file():
        return []  # packages_without_init says so
    body = ast.parse(init.read_text()).body
    docstring_only = len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
    return (
        [] if docstring_only else [f"tests/{SUPPORT}/__init__.py: a docstring only; helpers are modules of their own"]
    )


CHECKS: list[Callable[[Path], list[str]]] = [
    root_tests,
    other_files_at_the_root,
    helpers_outside_support,
    folders_without_a_counterpart,
    counterparts_gone,
    folders_missing,
    packages_without_init,
    support_tests,
    imports_of_test_files,
    support_init_is_a_docstring,
]


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_the_tests_folder_keeps_the_layout(check: Callable[[Path], list[str]]) -> None:
    assert check(TESTS) == []


def _tidy_tree(root: Path) -> Path:
    """A tests folder of the layout's shape, each test folder with one test, and the folders it mirrors."""
    tests = root / "tests"
    for folder in [*MIRRORS, *CONCERNS]:
        (tests / folder).mkdir(parents=True, exist_ok=True)
        (tests / folder / "__init__.py").write_text("")
        (tests / folder / f"test_{folder.replace('/', '_')}.py").write_text("def test_it() -> None:\n    pass\n")
    for target in MIRRORS.values():
        (root / target).mkdir(parents=True, exist_ok=True)
    (tests / SUPPORT / "chaos").mkdir(parents=True)
    (tests / SUPPORT / "__init__.py").write_text('"""Helpers."""\n')
    (tests / SUPPORT / "harness.py").write_text("HELP = 1\n")
    (tests / SUPPORT / "chaos" / "__init__.py").write_text("")
    (tests / SUPPORT / "data").mkdir()
    (tests / SUPPORT / "data" / "schema.json").write_text("{}\n")
    (tests / "__init__.py").write_text("")
    (tests / "conftest.py").write_text("")
    (tests / ".pytest_cache").mkdir()
    return tests


def _write(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _unknown_folder(tests: Path) -> None:
    _write(tests / "misc" / "__init__.py")
    _write(tests / "misc" / "test_x.py")


def _layout_folder_gone(tests: Path) -> None:
    for path in (tests / "suite").iterdir():
        path.unlink()
    (tests / "suite").rmdir()


#: One thing out of place each, and the one check that must name it.
MISPLACED: dict[str, tuple[Callable[[Path], object], Callable[[Path], list[str]]]] = {
    "a test at the root": (lambda t: _write(t / "test_dummy.py"), root_tests),
    "a helper at the root": (lambda t: _write(t / "dummy_jobs.py"), other_files_at_the_root),
    "data at the root": (lambda t: _write(t / "dummy.json", "{}"), other_files_at_the_root),
    "a helper in a test folder": (lambda t: _write(t / "store" / "fake_redis.py"), helpers_outside_support),
    "a folder of no concern": (_unknown_folder, folders_without_a_counterpart),
    "a mirrored module gone": (lambda t: (t.parent / "mcp_celery" / "cli").rmdir(), counterparts_gone),
    "a folder of the layout gone": (_layout_folder_gone, folders_missing),
    "a test folder without __init__.py": (lambda t: (t / "worker" / "__init__.py").unlink(), packages_without_init),
    "a support folder without __init__.py": (
        lambda t: _write(t / SUPPORT / "fakes" / "server.py"),
        packages_without_init,
    ),
    "a test in support": (lambda t: _write(t / SUPPORT / "test_helpers.py"), support_tests),
    "a helper imported from a test file": (
        lambda t: _write(t / "core" / "test_y.py", "from tests.store.test_store import make\n"),
        imports_of_test_files,
    ),
    "code in support's __init__": (
        lambda t: _write(t / SUPPORT / "__init__.py", '"""Helpers."""\n\nHELP = 1\n'),
        support_init_is_a_docstring,
    ),
}


def test_each_check_passes_a_tidy_tree(tmp_path: Path) -> None:
    tests = _tidy_tree(tmp_path)
    assert {check.__name__: check(tests) for check in CHECKS} == {check.__name__: [] for check in CHECKS}


@pytest.mark.parametrize("case", MISPLACED)
def test_each_check_names_what_is_out_of_place(tmp_path: Path, case: str) -> None:
    misplace, check = MISPLACED[case]
    tests = _tidy_tree(tmp_path)
    misplace(tests)
    failing = {other.__name__ for other in CHECKS if other(tests)}
    assert failing == {check.__name__}, (case, {other.__name__: other(tests) for other in CHECKS})
