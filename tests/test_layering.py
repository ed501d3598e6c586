"""The tiers hold: each import below runs in a fresh interpreter and lists what it loaded.

The worker side (job code, `celery worker`) must never load the MCP SDK's server, the client
library must load neither celery nor redis, and `import mcp_celery` alone loads no tier.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys

from tests.support import ROOT


def loaded_after(code: str) -> set[str]:
    """Top-level and `mcp.*` module names in sys.modules after running `code` in a new interpreter."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_importing_the_package_loads_no_tier() -> None:
    loaded = loaded_after("import mcp_celery")
    assert not {"celery", "redis", "mcp", "mcp_celery.worker", "mcp_celery.server"} & loaded


def test_the_worker_tier_and_job_code_never_load_the_mcp_sdk() -> None:
    for code in ("import mcp_celery.worker", "import tests.sample_jobs", "import jobs.demo"):
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
    loaded = loaded_after("import mcp_celery.cli")
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
