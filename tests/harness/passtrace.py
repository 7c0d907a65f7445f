"""How many modules one pass over a VM goes through, and how often it goes back.

``python -m tests.harness.passtrace`` runs one :meth:`Extender.handle
<pvestord.engine.extender.Extender.handle>` over the bed of
:mod:`tests.harness.extenderbed` (a fake QEMU on a real socket, a fake
``lvm``): VM 101 with one thin drive written past its threshold, a
``threshold`` entry for it, one extension. The pass runs under
:func:`sys.setprofile`, and the tool prints what it went through, then the
size of the product's modules. Issue 40 (item 2) measures the engine with it,
before and after a change of its structure.

Definitions. Only frames of ``pvestord`` modules count (a frame's module is
its ``__name__``); the standard library, asyncio and the fakes are looked
through. A frame *starts* at its first profile ``call`` event: a coroutine or
generator resumed later is the same call, not a new one. Each start has a
*caller*: the nearest ``pvestord`` frame below it on the stack (for a
coroutine, the one awaiting it), and a *stack*: the modules of every
``pvestord`` frame below it.

- **modules entered**: the distinct modules of the frames started during the
  pass (``handle`` included); **engine modules**: those of them in
  ``pvestord.engine``.
- **hop**: a start whose module differs from its caller's; **module
  pairs**: the distinct (caller module, callee module) pairs of the hops.
- **climb back up**: a hop into a module that is already on the stack below
  the caller: module A, called from B, calls back into B (a callback, a
  method of the object that called it). Counted per start (``climbs``) and
  per distinct (caller module, callee module) pair (``climb pairs``).
- **stays** and **returns to a module already left**: for each start in
  order, the caller's module and then the frame's own are written down,
  and runs of one module are joined: the modules a reader of the pass
  goes through, in order. Each run is a stay; a stay in a module that had
  an earlier one is a return to a module already left (``stays`` minus
  ``modules entered``).

Each figure is given twice: over all of ``pvestord``, and over the engine
alone (``pvestord.engine``: its modules only, the rest of ``pvestord``
looked through as the standard library is).

Sizes: every ``.py`` file under ``pvestord/`` (and under
``pvestord/engine/``) but ``__init__.py``, counted in lines.
"""

from __future__ import annotations

import asyncio
import logging
import os
import statistics
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import pytest

PRODUCT = "pvestord"
ENGINE = "pvestord.engine"
#: Modules under this many lines count as small (issue 40's "satellites").
SMALL = 60


def _within(module: str, scope: str) -> bool:
    return module == scope or module.startswith(scope + ".")


def _module(frame: FrameType) -> str | None:
    name = frame.f_globals.get("__name__")
    return name if isinstance(name, str) and name.split(".")[0] == PRODUCT else None


@dataclass
class Trace:
    """The starts of ``pvestord`` frames seen, as (stack of modules, module)."""

    starts: list[tuple[tuple[str, ...], str]] = field(default_factory=list)
    _seen: dict[int, FrameType] = field(default_factory=dict)

    def profile(self, frame: FrameType, event: str, arg: object) -> None:
        if event != "call" or id(frame) in self._seen:
            return
        # Kept alive, so that no new frame reuses the id of one seen.
        self._seen[id(frame)] = frame
        module = _module(frame)
        if module is None:
            return
        stack: list[str] = []
        below = frame.f_back
        while below is not None:
            if (name := _module(below)) is not None:
                stack.append(name)
            below = below.f_back
        self.starts.append((tuple(reversed(stack)), module))

    def figures(self, scope: str = PRODUCT) -> dict[str, int]:
        """The figures of the module docstring, over the modules under
        ``scope`` alone (``pvestord.engine``: the engine's own back and
        forth, the rest of the product looked through as the standard
        library is)."""
        starts = [(tuple(m for m in stack if _within(m, scope)), module)
                  for stack, module in self.starts if _within(module, scope)]
        modules = {module for _, module in starts}
        hops = climbs = 0
        pairs: set[tuple[str, str]] = set()
        climb_pairs: set[tuple[str, str]] = set()
        stays: list[str] = []
        for stack, module in starts:
            caller = stack[-1] if stack else None
            for name in (caller, module):
                if name is not None and (not stays or stays[-1] != name):
                    stays.append(name)
            if caller is None or caller == module:
                continue
            hops += 1
            pairs.add((caller, module))
            if module in stack[:-1]:
                climbs += 1
                climb_pairs.add((caller, module))
        return {"modules entered": len(modules),
                "engine modules": sum(_within(m, ENGINE) for m in modules),
                "hops": hops, "module pairs": len(pairs),
                "climbs": climbs, "climb pairs": len(climb_pairs),
                "stays": len(stays), "returns": len(stays) - len(modules)}

    def climb_pairs(self) -> Counter[tuple[str, str]]:
        return Counter((stack[-1], module) for stack, module in self.starts
                       if stack and stack[-1] != module and module in stack[:-1])


def trace_one_pass(folder: Path) -> Trace:
    """One threshold pass over the extender bed in ``folder``, traced."""
    # Imported here: the tool's own imports are not part of the pass.
    from pvestord.adapters.config import parse_storage_config
    from pvestord.adapters.vms import LocalVm
    from pvestord.engine.extender import Extender
    from pvestord.policy import Reason
    from tests.harness.extenderbed import (
        STORAGE_CFG,
        VMID,
        FakeQemu,
        bed_settings,
        extensions,
        fake_lvm_bed,
        running,
    )

    trace = Trace()
    with pytest.MonkeyPatch.context() as monkeypatch:
        bed = fake_lvm_bed(folder, monkeypatch)
        storage = parse_storage_config(STORAGE_CFG, "storage.cfg")
        extender = Extender(bed_settings(bed), lambda: storage)
        qemu = FakeQemu(bed)
        vm = LocalVm(VMID, os.getpid(), bed / f"{VMID}.qmp")

        async def one_pass() -> None:
            async with running(qemu, vm.qmp_socket):
                qemu.fill()
                sys.setprofile(trace.profile)
                try:
                    await extender.handle(vm, {"e0": Reason.THRESHOLD})
                finally:
                    sys.setprofile(None)
            await extender.close()

        asyncio.run(one_pass())
        if len(extensions(bed)) != 1:
            raise SystemExit(f"passtrace: the pass made {extensions(bed)}, not one extension")
    return trace


def module_sizes(root: Path) -> dict[str, int]:
    """Lines per module under ``root``, ``__init__.py`` left out."""
    return {str(path.relative_to(root.parent)): len(path.read_text().splitlines())
            for path in sorted(root.rglob("*.py")) if path.name != "__init__.py"}


def size_figures(sizes: dict[str, int]) -> dict[str, int]:
    lines = list(sizes.values())
    return {"modules": len(lines), "median lines": round(statistics.median(lines)),
            f"under {SMALL} lines": sum(n < SMALL for n in lines)}


def main() -> int:
    # The bed has no QEMU process to look at, which the pass says at warning.
    logging.getLogger(PRODUCT).setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="passtrace-") as folder:
        trace = trace_one_pass(Path(folder))
    print("one threshold pass (Extender.handle):")
    for scope in (PRODUCT, ENGINE):
        figures = trace.figures(scope)
        if scope == ENGINE:
            del figures["engine modules"]
        print(f"  {scope}/: " + ", ".join(f"{k} {v}" for k, v in figures.items()))
    modules = sorted({module for _, module in trace.starts})
    print("  modules: " + " ".join(m.removeprefix(PRODUCT + ".") for m in modules))
    for (caller, module), times in sorted(trace.climb_pairs().items()):
        print(f"  climb back: {caller} -> {module} ({times}x)")
    root = Path(__file__).resolve().parents[2] / PRODUCT
    for label, folder_ in ((PRODUCT, root), (ENGINE, root / "engine")):
        sizes = module_sizes(folder_)
        figures = size_figures(sizes)
        print(f"{label}/: " + ", ".join(f"{k} {v}" for k, v in figures.items()))
        if folder_.name == "engine":
            print("  " + " ".join(f"{Path(p).stem}:{n}" for p, n in
                                  sorted(sizes.items(), key=lambda item: item[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
