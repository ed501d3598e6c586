"""The command-line programs the jobs run, as their Python packages install them (the `jobs` extra)."""

from __future__ import annotations

import shutil
import sys
import sysconfig
from pathlib import Path

__all__ = ["installed_binary"]


def installed_binary(name: str, what: str) -> str:
    """The executable `name`: the one its wheel put next to this Python, else the first on PATH.

    Next to this Python first, so that a worker in a virtualenv runs the version its extra pinned.

    Raises:
        RuntimeError: it is not installed (`what` names it in the message).
    """
    for directory in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        if (directory / name).is_file():
            return str(directory / name)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{what} is not installed: pip install 'mcp-celery[jobs]'")
    return found
