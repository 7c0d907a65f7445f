#!/usr/bin/env python3
"""TEST STAND-IN for the ``lvm`` pvestord runs (``PVESTORD_LVM``): answers its
``vgs`` and ``lvs`` reports from the VG the Perl LVM stand-in keeps
(``PvestordTest/LvmRecorder.pm``, ``$PVESTORD_TEST_LVM_STATE``; ``"open": true``
reports an LV open on this node). ``pvestord plugin`` only reads LVM; the
``lvreduce`` and ``lvchange --deltag`` of ``pvestord volume reduce-copy`` are
carried out on that VG and, with ``$PVESTORD_TEST_PY_LVM_LOG`` set, appended
there as ``{"command", "locks"}``: the lock directories pvestord held in
``$PVESTORD_TEST_PY_LOCK_DIR`` (its ``--lock-dir``) while it ran. Everything
else is refused."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


def main(argv: list[str]) -> int:
    state = json.loads(Path(os.environ["PVESTORD_TEST_LVM_STATE"]).read_text())
    vg, lvs = state["vg"], state["lvs"]
    command = argv[0] if argv else ""
    if argv[-1:] != [vg] and not (argv[-1:] and argv[-1].startswith(f"{vg}/")):
        print(f"  Volume group \"{argv[-1:]}\" not found", file=sys.stderr)
        return 5
    if command == "vgs":
        used = sum(lv["size"] for lv in lvs.values())
        row = {"vg_name": vg, "vg_size": str(state["size"]), "vg_free": str(state["size"] - used),
               "vg_extent_size": str(state["extent"])}
        print(json.dumps({"report": [{"vg": [row]}]}))
        return 0
    if command == "lvs":
        # "vg/lv" asks for that LV alone; "active": false is an LV active on
        # another node only (its tags are VG metadata, read here all the same).
        one = argv[-1].split("/", 1)[1] if "/" in argv[-1] else None
        rows = [{"vg_name": vg, "lv_name": name, "lv_size": str(lv["size"]),
                 "lv_tags": ",".join(lv["tags"]), "vg_extent_size": str(state["extent"]),
                 "vg_free": "0", "lv_active": "active" if lv.get("active", True) else "",
                 "lv_device_open": "open" if lv.get("open") else "",
                 "lv_attr": "-wi-a-----" if lv.get("active", True) else "-wi-------"}
                for name, lv in sorted(lvs.items()) if one is None or name == one]
        print(json.dumps({"report": [{"lv": rows}]}))
        return 0
    if command in ("lvreduce", "lvchange"):
        return change(state, argv)
    print(f"fake lvm: not a report: {argv}", file=sys.stderr)
    return 3


def _values(argv: list[str], option: str) -> list[str]:
    return [argv[i + 1] for i in range(len(argv) - 1) if argv[i] == option]


def change(state: dict[str, Any], argv: list[str]) -> int:
    """``lvreduce -f --size <bytes>b VG/LV`` or ``lvchange --deltag T VG/LV``."""
    vg, lvs = state["vg"], state["lvs"]
    name = argv[-1].split("/", 1)[1]
    lv = lvs.get(name)
    if lv is None:
        print(f"  Failed to find logical volume \"{argv[-1]}\"", file=sys.stderr)
        return 5
    if argv[0] == "lvreduce":
        size = int(_values(argv, "--size")[0].removesuffix("b"))
        if size % state["extent"] or size >= lv["size"]:
            print(f"fake lvm: bad reduction of {lv['size']} to {size}", file=sys.stderr)
            return 3
        lv["size"] = size
    else:
        deleted = _values(argv, "--deltag")
        if not deleted:
            print(f"fake lvm: only --deltag is carried out: {argv}", file=sys.stderr)
            return 3
        lv["tags"] = [t for t in lv["tags"] if t not in deleted]
    Path(os.environ["PVESTORD_TEST_LVM_STATE"]).write_text(json.dumps(state))
    log = os.environ.get("PVESTORD_TEST_PY_LVM_LOG")
    if log:
        lock_dir = Path(os.environ["PVESTORD_TEST_PY_LOCK_DIR"])
        held = sorted(p.name for p in lock_dir.iterdir()) if lock_dir.is_dir() else []
        with open(log, "a") as out:
            out.write(json.dumps({"command": argv, "locks": held, "vg": vg}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
