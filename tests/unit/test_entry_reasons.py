"""Which thin drives a queue entry's node-name applies to (REVIEW 3.2)."""

from __future__ import annotations

from pvestord.adapters.config import ThinStorage
from pvestord.adapters.qmp import ThinDriveView
from pvestord.engine.extender import Drive, reason_for
from pvestord.policy import Reason

MiB = 1024 * 1024


def thin_drive(index: int) -> Drive:
    view = ThinDriveView(file_node=f"file{index}", format_node=f"fmt{index}",
                         path=f"/dev/san/vm-101-disk-{index}.qcow2", virtual_size=8192 * MiB,
                         allocation=0, threshold=0)
    storage = ThinStorage("san", "san", chunksize=256 * MiB, chunk_percentage=0.5,
                          initial_size=256 * MiB, shared=True, options={})
    return Drive(view, "san", f"vm-101-disk-{index}.qcow2", storage, maximum=8196 * MiB,
                 extent_size=4 * MiB, lv_size=256 * MiB)


DRIVES = [thin_drive(0), thin_drive(1)]
THIN_NODES = {"file0", "fmt0", "file1", "fmt1"}


def reasons(requests: dict[str, Reason]) -> list[Reason | None]:
    return [reason_for(d, requests, THIN_NODES) for d in DRIVES]


def test_a_name_of_a_thin_drive_applies_to_that_drive_only() -> None:
    assert reasons({"file1": Reason.MANUAL}) == [None, Reason.MANUAL]
    assert reasons({"fmt0": Reason.THRESHOLD}) == [Reason.THRESHOLD, None]


def test_only_nospace_falls_back_to_every_thin_drive() -> None:
    # BLOCK_IO_ERROR names the device's root node (a throttle filter in PVE 9).
    assert reasons({"drive-scsi0": Reason.NOSPACE}) == [Reason.NOSPACE, Reason.NOSPACE]
    # A typo in `pvestord extend`, or a manual entry for a non-thin node: nothing.
    assert reasons({"file-typo": Reason.MANUAL}) == [None, None]
    assert reasons({"drive-scsi2": Reason.THRESHOLD}) == [None, None]
    assert reasons({"file-typo": Reason.ARM}) == [None, None]


def test_reconcile_looks_at_every_drive() -> None:
    assert [reason_for(d, None, THIN_NODES) for d in DRIVES] == [Reason.ARM, Reason.ARM]
