"""The live-migration hint's pure parts: which LVs are the VM's, the outgoing mark and
when it defers, the CLI."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pvestord.adapters import vmlvs
from pvestord.adapters.config import parse_storage_config
from pvestord.adapters.lvm import LvRow
from pvestord.engine import migration
from pvestord.engine.migration import Deferral

CFG = """lvm: thin
\tvgname san
\tpvestord-chunksize 1G
\tshared 1

lvm: thick
\tvgname other

lvm: thin2
\tvgname san2
\tpvestord-chunksize 256M
"""


def row(vg: str, lv: str, active: bool = True) -> LvRow:
    return LvRow(vg, lv, 1 << 30, (), active, False, "-")


def test_vm_lvs_are_the_active_thin_lvs_of_the_vms_chains() -> None:
    config = parse_storage_config(CFG, "storage.cfg")
    rows = {
        "san": [row("san", "vm-10-disk-0.qcow2"), row("san", "vm-100-disk-0.qcow2"),
                row("san", "vm-10-disk-1.qcow2", active=False), row("san", "base-10-disk-0"),
                # the disk's snapshot LV: a backing file the target opens too
                row("san", "snap_vm-10-disk-0_before.qcow2"),
                row("san", "snap_vm-100-disk-0_before.qcow2")],
        "other": [row("other", "vm-10-disk-0.qcow2")],   # not thin: never ours
        "san2": [row("san2", "vm-10-state-x.qcow2")],
    }
    found = sorted((s.storeid, r.lv) for s, r in vmlvs.vm_lvs(config, rows, 10))
    assert found == [("thin", "snap_vm-10-disk-0_before.qcow2"), ("thin", "vm-10-disk-0.qcow2"),
                     ("thin2", "vm-10-state-x.qcow2")]


def test_outgoing_mark_defers_until_removed_or_past_its_grace(tmp_path: Path) -> None:
    assert not migration.outgoing_marked(tmp_path, 7)
    mark = migration.mark_path(tmp_path, 7)
    mark.write_text("outgoing 0\n")
    assert migration.outgoing_marked(tmp_path, 7)
    assert not migration.outgoing_marked(tmp_path, 8)
    old = time.time() - migration.MARK_GRACE - 1
    os.utime(mark, (old, old))
    assert not migration.outgoing_marked(tmp_path, 7)  # a hook that never said "end"


@given(in_flight=st.booleans(),
       mark_age=st.none() | st.floats(allow_nan=False, allow_infinity=False),
       grace=st.floats(min_value=0, max_value=1e6))
def test_deferral_rules(in_flight: bool, mark_age: float | None, grace: float) -> None:
    decided = migration.deferral(in_flight=in_flight, mark_age=mark_age, grace=grace)
    # QEMU's word wins: a migration in flight always defers, mark or not.
    assert (decided is Deferral.IN_FLIGHT) is in_flight
    if not in_flight:
        # Without a migration, only a mark within its grace defers: a mark
        # left over can never hold a VM for longer than the grace.
        assert decided.defers is (mark_age is not None and abs(mark_age) < grace)
        assert (decided is Deferral.STALE) is (mark_age is not None and abs(mark_age) >= grace)
        assert (decided is Deferral.NONE) is (mark_age is None)


def test_stale_mark_is_removed_and_said_at_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    mark = migration.mark_path(tmp_path, 7)
    mark.write_text("outgoing 0\n")
    old = time.time() - migration.MARK_GRACE - 5
    os.utime(mark, (old, old))
    with caplog.at_level(logging.WARNING, logger="pvestord.engine.migration"):
        decided = migration.outgoing_deferral(tmp_path, 7, in_flight=False)
    assert decided is Deferral.STALE and not decided.defers
    assert not mark.exists()
    [record] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert record.VMID == "7"  # type: ignore[attr-defined]
    assert int(record.DURATION_MS) >= (migration.MARK_GRACE + 5) * 1000  # type: ignore[attr-defined]
    # Gone: the next look is an ordinary one, and says nothing.
    caplog.clear()
    assert migration.outgoing_deferral(tmp_path, 7, in_flight=False) is Deferral.NONE
    assert not caplog.records


def test_migration_in_flight_refreshes_the_mark(tmp_path: Path) -> None:
    """The grace runs from the last time the migration was seen in flight: a
    long migration that then fails keeps deferring a little while for its
    hook's ``end``, not forever and not from the mark's writing."""
    mark = migration.mark_path(tmp_path, 7)
    mark.write_text("outgoing 0\n")
    old = time.time() - migration.MARK_GRACE - 5
    os.utime(mark, (old, old))
    assert migration.outgoing_deferral(tmp_path, 7, in_flight=True) is Deferral.IN_FLIGHT
    assert time.time() - mark.stat().st_mtime < migration.MARK_GRACE
    assert migration.outgoing_deferral(tmp_path, 7, in_flight=False) is Deferral.MARKED
    # No mark, migration in flight: deferred, and no mark is made.
    assert migration.outgoing_deferral(tmp_path, 8, in_flight=True).defers
    assert not migration.mark_path(tmp_path, 8).exists()


def test_cli_rejects_a_bad_role() -> None:
    pvestord = Path(sys.executable).parent / "pvestord"
    proc = subprocess.run(  # noqa: S603 - argument list
        [str(pvestord), "migration", "begin", "5", "--role", "sideways"],
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert "sideways" in proc.stderr
