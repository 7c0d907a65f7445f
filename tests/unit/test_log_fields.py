"""Every journal field the code logs is also printed on stderr.

Tests and admins running ``pvestord -v run`` by hand read the fields from
the stderr format, which prints only :data:`pvestord.adapters.service.FIELDS`;
a field missing there is invisible outside the journal (the capacity
warning's ``CAPACITY_LEVEL`` was, until this test).
"""

from __future__ import annotations

import ast
from pathlib import Path

from pvestord.adapters.service import FIELDS

ROOT = Path(__file__).resolve().parents[2]


def logged_fields() -> dict[str, str]:
    """Field name -> a file that logs it, from every ``fields(...)`` call."""
    found: dict[str, str] = {}
    for package in ("pvestord", "qmeventd_py"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        and node.func.id == "fields"):
                    for keyword in node.keywords:
                        if keyword.arg is not None:
                            found.setdefault(keyword.arg, str(path.relative_to(ROOT)))
    return found


def test_every_logged_field_is_printed_on_stderr() -> None:
    logged = logged_fields()
    assert {"VMID", "BLOCK_NODE", "LV", "CAPACITY_LEVEL"} <= set(logged)  # the scan works
    missing = {name: where for name, where in logged.items() if name not in FIELDS}
    assert missing == {}
