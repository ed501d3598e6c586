"""A small repository for the code review tests: a renamed duplicate, a broad except, unused imports, house rules."""

from __future__ import annotations

from pathlib import Path

ORDERS = '''"""Orders."""

import json


def order_total(path):
    with open(path) as handle:
        orders = json.load(handle)
    if not orders:
        raise ValueError("no orders")
    amounts = [order["amount"] for order in orders]
    total = sum(amounts)
    return round(total, 2)
'''
INVOICES = ORDERS.replace("Orders", "Invoices").replace("order", "invoice").replace("amount", "due")
UTIL = '''"""Helpers."""

import os
import sys


def read_config(path):
    try:
        with open(path) as handle:
            return handle.read()
    except Exception:
        return ""
'''
UTIL_EXCEPT_LINE = 11
RULES = """# House rules

Catch the exceptions you expect, never `Exception`.

```review-rules
max_line_length = 100

[[forbid]]
pattern = 'except Exception\\b'
files = "*.py"
rule = "no-broad-except"
message = "catches every exception, bugs included"
suggestion = "catch the exceptions you expect"
```
"""


def make_repo(base: Path) -> Path:
    """A repository with a renamed duplicate (orders/invoices), a broad except and two unused imports (util)."""
    root, outside = base / "repo", base / "outside"
    files = {
        "pkg/orders.py": ORDERS,
        "pkg/invoices.py": INVOICES,
        "pkg/util.py": UTIL,
        "pkg/generated/copy.py": ORDERS,  # ignored by .gitignore: its duplicate is not reported
        ".review.md": RULES,
        ".gitignore": "generated/\n",
        "ruff.toml": '[lint]\nselect = ["F"]\n',
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (outside / "secret.py").parent.mkdir(parents=True)
    (outside / "secret.py").write_text(ORDERS)
    (root / "pkg" / "leak.py").symlink_to(outside / "secret.py")
    (root / "escape").symlink_to(outside, target_is_directory=True)
    return root
