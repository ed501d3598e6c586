"""The tiers hold: each import below runs in a fresh interpreter and lists what it loaded.

The worker side (job code, `celery worker`) must never load the MCP SDK's server, the client
library must load neither celery nor redis, and `import mcp_celery` alone loads no tier.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

from tests.support.harness import ROOT


def loaded_after(code: str) -> set[str]:
    """Top-level and `mcp.*` module names in sys.modules after running `code` in a new interpreter."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_importing_the_package_loads_no_tier() -> None:
    loaded = loaded_after("import mcp_celery")
    assert not {"celery", "redis", "mcp", "mcp_celery.worker", "mcp_celery.server"} & loaded


def test_the_worker_tier_and_job_code_never_load_the_mcp_sdk() -> None:
    for code in ("import mcp_celery.worker", "import tests.support.sample_jobs", "import jobs.demo"):
        loaded = loaded_after(code)
        assert "mcp" not in loaded and not any(m.startswith("mcp.") for m in loaded), code
        assert "mcp_celery.server" not in loaded, code
        assert "celery" in loaded, code  # the probe did load the worker side


def test_the_client_tier_loads_neither_celery_nor_redis() -> None:
    loaded = loaded_after("import mcp_celery.client")
    assert "celery" not in loaded and "redis" not in loaded
    assert "mcp_celery.client" in loaded


def test_the_server_tier_never_loads_the_worker_tier() -> None:
    loaded = loaded_after("import mcp_celery.server")
    assert "mcp_celery.worker" not in loaded
    assert "mcp.server" in loaded


def test_the_command_line_loads_each_tier_only_when_its_subcommand_runs() -> None:
    loaded = loaded_after("import mcp_celery.cli.command")
    assert not {"celery", "redis", "mcp", "uvicorn"} & loaded


def test_modules_and_functions_stay_small() -> None:
    """Small rooms: no module of the package over 500 lines, no function over 50 (docstring excluded)."""
    too_long = []
    for path in sorted((ROOT / "mcp_celery").rglob("*.py")):
        source = path.read_text()
        if source.count("\n") > 500:
            too_long.append(f"{path.relative_to(ROOT)}: {source.count(chr(10))} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = node.body[0]
                docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                start = first.end_lineno + 1 if docstring and first.end_lineno else node.lineno
                length = (node.end_lineno or node.lineno) - start + 1
                if length > 50:
                    too_long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {length} lines")
    assert not too_long, too_long


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(name: str, path: Path, node: ast.Import | ast.ImportFrom, modules: set[str]) -> set[str]:
    """The package's modules an import statement names: `from pkg import mod` names `pkg.mod`."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in modules}
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    if node.level:
        base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    found = set()
    for alias in node.names:
        if f"{base}.{alias.name}" in modules:
            found.add(f"{base}.{alias.name}")
        elif base in modules:
            found.add(base)
    return found


def import_graph() -> dict[str, set[str]]:
    """Each module of the package and the package modules it imports: anywhere in it (at the top, under
    TYPE_CHECKING or inside a function), since an import moved out of the way still ties the two
    modules together. A module's own packages (their `__init__`s, which Python runs before the module,
    `mcp_celery.__version__`) are not edges."""
    paths = {_module_name(path): path for path in (ROOT / "mcp_celery").rglob("*.py")}
    modules = set(paths)
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        imports = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                imports |= _imported(name, path, node, modules)
        ancestors = {name.rsplit(".", depth)[0] for depth in range(1, name.count(".") + 1)}
        graph[name] = imports - {name} - ancestors
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while (member := stack.pop()) != node:
                component.append(member)
            if component:
                found.append(sorted([node, *component]))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_import_graph_finds_a_cycle_it_is_shown() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_of_the_package_imports_itself_through_others() -> None:
    graph = import_graph()
    assert (
        "mcp_celery.server.engine.reaper" in graph["mcp_celery.server.engine.service"]
    )  # the walk sees `from x import y`
    assert "mcp_celery.worker.signals" in graph["mcp_celery.worker"]
    assert cycles(graph) == []


def _imports_into(graph: dict[str, set[str]], sources: tuple[str, ...], targets: tuple[str, ...]) -> list[str]:
    """Each `module -> imported` edge from a module under `sources` to one under `targets`."""

    def under(name: str, prefixes: tuple[str, ...]) -> bool:
        return any(name == p or name.startswith(p + ".") for p in prefixes)

    return sorted(
        f"{m} -> {i}" for m, imports in graph.items() if under(m, sources) for i in imports if under(i, targets)
    )


def test_each_folder_imports_only_the_folders_below_it() -> None:
    """core/ and store/ below worker/ and server/; in the server, the engine, the edge and ops below the
    surfaces (tasks/, plain/) and the wiring (app, http); the test helpers only for commands and tests."""
    graph = import_graph()
    m = "mcp_celery."
    sides = (m + "worker", m + "server", m + "client", m + "cli", m + "testing")
    assert _imports_into(graph, (m + "core", m + "store"), sides) == []
    surfaces = (m + "server.tasks", m + "server.plain", m + "server.app", m + "server.http")
    assert _imports_into(graph, (m + "server.engine", m + "server.edge", m + "server.ops"), surfaces) == []
    assert (
        _imports_into(graph, (m + "worker", m + "server", m + "client", m + "core", m + "store"), (m + "testing",))
        == []
    )


def test_each_package_docstring_maps_every_module_in_it() -> None:
    unmapped = []
    for init in sorted((ROOT / "mcp_celery").rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        for path in sorted(init.parent.iterdir()):
            name = path.stem if path.suffix == ".py" else path.name
            if name.startswith("__") or not (path.suffix == ".py" or (path / "__init__.py").exists()):
                continue
            if not re.search(rf"(?<![\w.]){re.escape(name)}(\.py|/|\b)", doc):
                unmapped.append(f"{init.relative_to(ROOT)}: {name}")
    assert unmapped == []
