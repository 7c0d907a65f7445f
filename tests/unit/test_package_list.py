"""Every Python package of the product is in pyproject.toml's package list.

The list is explicit (setuptools 66, Debian 12's, builds the .deb), so a new
subpackage left out of it installs from a checkout but not from the package:
the installed ``pvestord`` then fails at start with ModuleNotFoundError.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_with_an_init_is_listed() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    found = {init.parent.relative_to(ROOT).as_posix().replace("/", ".")
             for top in ("pvestord", "qmeventd_py", "ha_placement")
             for init in (ROOT / top).rglob("__init__.py")}
    assert found == listed
