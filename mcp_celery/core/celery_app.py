"""Finding a Celery app from `-A module[:app]`, as `celery -A` does.

Tier 1 (celery). Shared by `mcp-celery serve` and the HTTP app factory of `serve --workers N`.
A host that starts `serve` itself (Claude Desktop, say) runs it in a directory of its own
choosing, so the project's directory must come from somewhere: the current directory, as for
`celery -A`, `--workdir DIR` (`use_workdir`, also through PYTHONPATH for the server processes it
starts), or `-A` naming the module's file (`proj.py`, `/path/to/proj.py:app`), whose directory is
searched first. An import that fails says which directories were searched.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

from celery import Celery
from celery.exceptions import NotRegistered

from mcp_celery.errors import ConfigurationError

__all__ = ["load_app", "use_workdir"]

#: How to point the server at the project, for an import that fails.
HOW_TO_FIND = "start mcp-celery in the project's directory, pass --workdir DIR, or set PYTHONPATH"


def use_workdir(directory: str) -> str:
    """Put `directory` first on the import path, as `celery --workdir` makes it the current one;
    through PYTHONPATH too, for the server processes `serve --http --workers N` starts. Returns it, absolute.

    Raises:
        ConfigurationError: it is not a directory.
    """
    folder = os.path.abspath(os.path.expanduser(directory))
    if not os.path.isdir(folder):
        raise ConfigurationError(f"--workdir {directory}: not a directory")
    sys.path.insert(0, folder)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [folder, os.environ.get("PYTHONPATH")]))
    return folder


def load_app(spec: str) -> Celery:
    """Import `module` or `module:attribute` and return its Celery app, as `celery -A` does.

    The module may be given as its file, `proj.py` or `/path/to/proj.py`: its directory then
    comes first on the import path.

    Raises:
        ConfigurationError: nothing importable there (saying where it looked), no Celery app in it,
            or it names a Celery task that is not registered (its module was not imported).
    """
    module_name, attribute = _module_of(spec)
    if "" not in sys.path:
        sys.path.insert(0, "")  # like celery -A: the current directory is importable
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"cannot import {module_name!r}: {exc}; searched {', '.join(_project_dirs())} and the installed "
            f"packages ({HOW_TO_FIND})"
        ) from exc
    except NotRegistered as exc:  # app.tasks["proj.tasks.add"] before proj.tasks was imported
        raise ConfigurationError(
            f"importing {module_name!r}: Celery has no task {exc}; import the module that defines it first "
            "(or pass the task itself to mcp_celery.expose)"
        ) from exc
    candidates = [attribute] if attribute else ["app", "celery"]
    for name in candidates:
        found = getattr(module, name, None)
        if isinstance(found, Celery):
            return found
    apps = [v for v in vars(module).values() if isinstance(v, Celery)]
    if not attribute and len(apps) == 1:
        return apps[0]
    raise ConfigurationError(
        f"no Celery app {'named ' + repr(attribute) if attribute else ''} found in {module_name!r}"
    )


def _module_of(spec: str) -> tuple[str, str]:
    """(module name, attribute) of `-A`; a module given as its file puts its directory first on the path.

    Raises:
        ConfigurationError: a `.py` file that does not exist.
    """
    path, colon, attribute = spec.rpartition(":")
    if not colon or not attribute.isidentifier():  # no attribute (or a Windows drive's colon)
        path, attribute = spec, ""
    if not path.endswith(".py"):
        return path, attribute
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigurationError(f"-A {spec}: no such file {str(file.absolute())!r}")
    folder = str(file.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return file.stem, attribute


def _project_dirs() -> list[str]:
    """The directories on the import path outside the Python installation: where a project's module may be."""
    installed = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    found: list[str] = []
    for entry in sys.path:
        folder = os.path.realpath(entry or os.getcwd())
        inside = any(folder == base or folder.startswith(base + os.sep) for base in installed)
        if not inside and os.path.isdir(folder) and folder not in found:
            found.append(folder)
    return found
