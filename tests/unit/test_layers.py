"""The layers of the package, as the folder tree shows them, enforced.

A module may import its own layer and the ones below it, never one above:
pure policy knows nothing of LVM or QEMU, the adapters nothing of the engine,
the engine nothing of the features or the command line. ``qmeventd_py`` is a
program of its own beside ``pvestord``: it uses the policy and the adapters
(the queue, the locks, the journal), never the engine. ``ha_placement``, the
model of Proxmox HA placement, stands alone: it imports the standard library
only, and only ``pvestord placement`` imports it, so that it can be read,
tested and one day shipped without pvestord.

The tests have one rule of their own: no module imports a test module
(``test_*.py``). What test modules share lives in ``tests/harness``, and a
fixture they share in a ``conftest.py``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Lower first. The vocabulary (errors, paths) is below everything.
LAYERS = ("vocabulary", "policy", "adapters", "engine", "features", "cli")
VOCABULARY = {"pvestord", "pvestord.errors", "pvestord.paths"}
#: Modules of ours that run beside the product, never imported by it.
PROGRAMS = {"qmeventd_py": "adapters"}
#: Packages of ours that import nothing of pvestord, and the modules of ours
#: allowed to import them: the command that puts them before the admin.
LIBRARIES = {"ha_placement": {"pvestord.cli.placement"}}
OURS = ("pvestord", *PROGRAMS, *LIBRARIES)
#: A program's command-line parser, and the one module of pvestord that may
#: read it: the manual pages of both programs are written from their parsers.
PARSERS_READ = {"qmeventd_py.options": {"pvestord.cli.manpage"}}


def layer_of(module: str) -> str:
    if module in VOCABULARY:
        return "vocabulary"
    top, _, rest = module.partition(".")
    if top in PROGRAMS or top in LIBRARIES:
        return top
    sub = rest.split(".")[0]
    if top == "pvestord" and sub in LAYERS:
        return sub
    raise AssertionError(f"{module} belongs to no layer: put it in one of {LAYERS}")


def modules() -> list[tuple[str, Path]]:
    found = []
    for package in OURS:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found.append((name, path))
    return found


def imports_of(path: Path, module: str) -> set[str]:
    """Every module of ours that ``path`` imports, at any depth of its code."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[:len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            # ``from pvestord import lvm`` imports the submodule, not the package.
            found.update(f"{base}.{alias.name}" for alias in node.names
                         if base in (*OURS, *(f"pvestord.{layer}" for layer in LAYERS)))
    return {name for name in found if name.split(".")[0] in OURS and _is_module(name)}


def top_level_imports(path: Path) -> set[str]:
    """The top-level names of every absolute import in ``path``: ``os`` for
    ``os.path``, ``collections`` for ``from collections.abc import Mapping``."""
    imported: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            imported.add((node.module or "").split(".")[0])
    return imported


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def allowed(importer: str, imported: str) -> bool:
    mine, theirs = layer_of(importer), layer_of(imported)
    if importer in PARSERS_READ.get(imported, ()):
        return True
    if mine in LIBRARIES:
        return theirs == mine
    if theirs in LIBRARIES:
        return importer in LIBRARIES[theirs]
    if mine in PROGRAMS:
        return theirs == mine or LAYERS.index(theirs) <= LAYERS.index(PROGRAMS[mine])
    if theirs in PROGRAMS:
        return False
    return LAYERS.index(theirs) <= LAYERS.index(mine)


@pytest.mark.parametrize(("module", "path"), modules(), ids=[m for m, _ in modules()])
def test_imports_only_its_layer_or_below(module: str, path: Path) -> None:
    wrong = sorted(name for name in imports_of(path, module) if not allowed(module, name))
    assert not wrong, f"{module} ({layer_of(module)}) imports what it may not: {wrong}"


def imported_test_modules(path: Path) -> set[str]:
    """The test modules (``tests.….test_*``) that ``path`` imports, by name or
    by ``from tests.x import test_y``, at any depth of its code."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found
            if name.split(".")[0] == "tests" and name.split(".")[-1].startswith("test_")
            and _is_module(name)}


def test_no_module_imports_a_test_module() -> None:
    """A test module imported by another runs its fixtures and constants
    twice under two names, and hides shared code where nobody looks for it."""
    wrong = {}
    for folder in ("tests", "bench", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if imported := imported_test_modules(path):
                wrong[str(path.relative_to(ROOT))] = sorted(imported)
    assert not wrong, f"put what these share in tests/harness (or a conftest.py): {wrong}"


def test_libraries_import_only_the_standard_library() -> None:
    """Not pvestord, and no third-party package either: what is installed with
    Python is all a library of ours may need."""
    for module, path in modules():
        if layer_of(module) not in LIBRARIES:
            continue
        imported = top_level_imports(path)
        foreign = imported - set(sys.stdlib_module_names) - {layer_of(module)}
        assert not foreign, f"{module} imports {sorted(foreign)}"


def test_cli_modules_keep_to_their_own_private_helpers() -> None:
    for module, path in modules():
        if layer_of(module) != "cli":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pvestord.cli"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{module} uses {node.module}'s private {private}"


def test_policy_does_no_io() -> None:
    """The pure layer imports no module that reaches outside the process."""
    io_modules = {"asyncio", "os", "subprocess", "socket", "pathlib", "shutil", "time",
                  "fcntl", "logging", "tempfile", "threading", "io"}
    for module, path in modules():
        if layer_of(module) != "policy":
            continue
        imported = top_level_imports(path)
        assert not imported & io_modules, f"{module} imports {sorted(imported & io_modules)}"


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    """The rules themselves: an adapter importing the engine is refused."""
    assert not allowed("pvestord.adapters.qmp", "pvestord.engine.extender")
    assert not allowed("pvestord.policy.extension", "pvestord.adapters.queue")
    assert not allowed("qmeventd_py.server", "pvestord.engine.daemon")
    assert allowed("qmeventd_py.server", "pvestord.adapters.queue")
    assert allowed("pvestord.cli.engine", "pvestord.engine.daemon")
    assert allowed("pvestord.adapters.qmp", "pvestord.policy.devices")
    assert not allowed("ha_placement.inputs", "pvestord.errors")
    assert not allowed("pvestord.features.ranking", "ha_placement.manager")
    assert not allowed("qmeventd_py.server", "ha_placement")
    assert allowed("pvestord.cli.manpage", "qmeventd_py.options")
    assert not allowed("pvestord.cli.manpage", "qmeventd_py.server")
    assert not allowed("pvestord.cli.status", "qmeventd_py.options")
    assert allowed("pvestord.cli.placement", "ha_placement.manager")
    assert allowed("ha_placement.inputs", "ha_placement.rules")
    source = tmp_path / "x.py"
    source.write_text("from pvestord import lvm\nfrom pvestord.engine import extender\n")
    assert imports_of(source, "pvestord.adapters.x") >= {"pvestord.engine.extender"}
