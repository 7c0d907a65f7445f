#!/usr/bin/env python3
"""TEST STAND-IN for the ``lvm`` pvestord runs (``PVESTORD_LVM``): answers its
``vgs`` and ``lvs`` reports from the VG the Perl LVM stand-in keeps
(``PvestordTest/LvmRecorder.pm``, ``$PVESTORD_TEST_LVM_STATE``), and refuses
everything else: ``pvestord plugin`` only reads LVM."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


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
                 "lv_device_open": "",
                 "lv_attr": "-wi-a-----" if lv.get("active", True) else "-wi-------"}
                for name, lv in sorted(lvs.items()) if one is None or name == one]
        print(json.dumps({"report": [{"lv": rows}]}))
        return 0
    print(f"fake lvm: not a report: {argv}", file=sys.stderr)
    return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
