"""The live-migration hint's pure parts: which LVs are the VM's, the outgoing mark, the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from pvestord import migration
from pvestord.config import parse_storage_config
from pvestord.lvm import LvRow

CFG = """lvm: thin
\tvgname san
\tchunksize 1G
\tshared 1

lvm: thick
\tvgname other

lvm: thin2
\tvgname san2
\tchunksize 256M
"""


def row(vg: str, lv: str, active: bool = True) -> LvRow:
    return LvRow(vg, lv, 1 << 30, (), active, False, "-")


def test_vm_lvs_are_the_active_thin_lvs_named_for_the_vm() -> None:
    config = parse_storage_config(CFG, "storage.cfg")
    rows = {
        "san": [row("san", "vm-10-disk-0.qcow2"), row("san", "vm-100-disk-0.qcow2"),
                row("san", "vm-10-disk-1.qcow2", active=False), row("san", "base-10-disk-0")],
        "other": [row("other", "vm-10-disk-0.qcow2")],   # not thin: never ours
        "san2": [row("san2", "vm-10-state-x.qcow2")],
    }
    found = sorted((s.storeid, r.lv) for s, r in migration.vm_lvs(config, rows, 10))
    assert found == [("thin", "vm-10-disk-0.qcow2"), ("thin2", "vm-10-state-x.qcow2")]


def test_outgoing_mark_defers_until_removed_or_expired(tmp_path: Path) -> None:
    assert not migration.outgoing_marked(tmp_path, 7)
    mark = migration.mark_path(tmp_path, 7)
    mark.write_text("outgoing 0\n")
    assert migration.outgoing_marked(tmp_path, 7)
    assert not migration.outgoing_marked(tmp_path, 8)
    old = time.time() - migration.MARK_EXPIRY - 1
    os.utime(mark, (old, old))
    assert not migration.outgoing_marked(tmp_path, 7)  # a hook that never said "end"


def test_cli_rejects_a_bad_role() -> None:
    pvestord = Path(sys.executable).parent / "pvestord"
    proc = subprocess.run(  # noqa: S603 - argument list
        [str(pvestord), "migration", "begin", "5", "--role", "sideways"],
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert "sideways" in proc.stderr
