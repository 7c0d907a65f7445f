"""Reading QEMU's replies: thin drives paired from block nodes, run state, fuzzed shapes."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pvestord.adapters.qmp import run_state_from, thin_drives_from

MiB = 1024 * 1024


def node(name: str, drv: str, path: str, *, ro: bool = False, size: int = 256 * MiB,
         threshold: int = 0) -> dict[str, Any]:
    return {"node-name": name, "drv": drv, "file": path, "ro": ro, "write_threshold": threshold,
            "image": {"virtual-size": size, "filename": path, "format": drv}}


LV = "/dev/san/vm-101-disk-0.qcow2"


def test_pairs_host_device_file_node_with_writable_qcow2_above() -> None:
    nodes = [node("f0", "qcow2", LV, size=8192 * MiB), node("e0", "host_device", LV,
                                                             threshold=128 * MiB)]
    stats = [{"node-name": "e0", "stats": {"wr_highest_offset": 42 * MiB}},
             {"node-name": "f0", "stats": {"wr_highest_offset": 7}}]
    (drive,) = thin_drives_from(nodes, stats)
    assert (drive.file_node, drive.format_node, drive.path) == ("e0", "f0", LV)
    assert drive.virtual_size == 8192 * MiB
    assert (drive.allocation, drive.threshold) == (42 * MiB, 128 * MiB)


def test_a_top_given_its_backing_at_run_time_is_paired_by_its_own_file() -> None:
    """qemu-server's live snapshot adds the new top with ``backing: null`` and
    then ``blockdev-snapshot``s it: QEMU names the top's qcow2 node with a
    ``json:`` pseudo-filename (seen with QEMU 7.2, the node tier's
    test_lv_identity.py). Its data is its own ``file``, not the backing's."""
    snap = "/dev/san/snap_vm-101-disk-0_s1.qcow2"
    top_file = ('json:{"backing": {"driver": "qcow2", "file": {"driver": "host_device",'
                f' "filename": "{snap}"}}}}, "driver": "qcow2", "file": {{"driver":'
                f' "host_device", "filename": "{LV}"}}}}')
    nodes = [node("t0", "throttle", "json:{}"), node("f0", "qcow2", top_file),
             node("e0", "host_device", LV), node("fs", "qcow2", snap, ro=True),
             node("es", "host_device", snap)]
    (drive,) = thin_drives_from(nodes, [])
    assert (drive.file_node, drive.format_node, drive.path) == ("e0", "f0", LV)


def test_read_only_backing_images_and_plain_files_are_not_thin() -> None:
    backing = "/dev/san/base-100-disk-0.qcow2"
    nodes = [node("f1", "qcow2", backing, ro=True), node("e1", "host_device", backing, ro=True),
             node("f2", "qcow2", "/var/lib/vz/a.qcow2"), node("e2", "file", "/var/lib/vz/a.qcow2"),
             node("t0", "throttle", "json:{}")]
    assert thin_drives_from(nodes, []) == []


def test_run_state_tells_nospace_from_other_pauses() -> None:
    block = [{"device": "scsi0", "io-status": "nospace", "inserted": {"file": LV}},
             {"device": "ide2", "io-status": "ok"}]
    paused = run_state_from({"running": False, "status": "io-error"}, block)
    assert paused.paused_on_nospace and paused.nospace_on(LV)
    assert not paused.nospace_on("/dev/san/vm-102-disk-0.qcow2")
    user = run_state_from({"running": False, "status": "paused"}, block)
    assert not user.paused_on_nospace and not user.nospace_on(LV)
    # QEMU 7.2 keeps io-status "nospace" after cont: running is running.
    resumed = run_state_from({"running": True, "status": "running"}, block)
    assert not resumed.paused_on_nospace and not resumed.nospace_on(LV)
    failed = run_state_from({"running": False, "status": "io-error"},
                            [*block, {"device": "x", "io-status": "failed", "inserted": {}}])
    assert not failed.paused_on_nospace  # a real I/O error is never ours to resume
    assert not failed.paused_for_room and not failed.nospace_on(LV)


def test_nospace_devices_are_matched_exactly_never_by_substring() -> None:
    """A pause on vm-101-disk-10 is not a pause on vm-101-disk-1."""
    disk1, disk10 = "/dev/san1/vm-101-disk-1", "/dev/san1/vm-101-disk-10"
    status = {"running": False, "status": "io-error"}
    paused = run_state_from(status, [
        {"device": "drive-scsi10", "io-status": "nospace",
         "inserted": {"file": disk10, "node-name": "drive-scsi10"}},
        {"device": "drive-scsi1", "io-status": "ok",
         "inserted": {"file": disk1, "node-name": "drive-scsi1"}}])
    assert paused.paused_on_nospace
    assert paused.nospace_on(disk10) and not paused.nospace_on(disk1, {"e1", "f1"})
    # PVE 9: the device's root is a throttle filter; its json: filename holds the path.
    throttled = run_state_from(status, [
        {"device": "", "qdev": "/machine/peripheral/scsi1/virtio-backend",
         "io-status": "nospace", "inserted": {"node-name": "drive-scsi1", "file": (
             'json:{"driver": "throttle", "file": {"driver": "qcow2", "file": '
             f'{{"driver": "host_device", "filename": "{disk10}"}}}}}}')}}])
    assert throttled.nospace_devices[0].name == "/machine/peripheral/scsi1/virtio-backend"
    assert throttled.nospace_on(disk10) and not throttled.nospace_on(disk1)
    # A plain -blockdev device whose root is the drive's format node.
    by_node = run_state_from(status, [
        {"device": "scsi0", "io-status": "nospace", "inserted": {"node-name": "f1"}}])
    assert by_node.nospace_on(disk1, {"e1", "f1"}) and not by_node.nospace_on(disk1, {"e10"})


def test_an_io_error_pause_no_device_owns_is_on_no_drive_of_its_own() -> None:
    """What a live migration brings: QEMU migrates the run state, not io-status.

    The VM is paused for room, but no drive says so: which drives count is
    the policy's rule (:func:`pvestord.policy.paused_out_of_room`), from each
    drive's figures, not every drive alike."""
    block = [{"device": "scsi0", "io-status": "ok", "inserted": {"file": LV}}]
    arrived = run_state_from({"running": False, "status": "io-error"}, block)
    assert arrived.paused_on_unowned_error and arrived.paused_for_room
    assert not arrived.paused_on_nospace
    assert not arrived.nospace_on(LV)
    assert not arrived.nospace_on("/dev/san/vm-102-disk-0.qcow2")
    for status in ({"running": True, "status": "running"},
                   {"running": False, "status": "paused"},
                   {"running": False, "status": "inmigrate"}):
        other = run_state_from(status, block)
        assert not other.paused_for_room and not other.nospace_on(LV)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                  max_size=6),
    max_leaves=30)
node_like = st.fixed_dictionaries({}, optional={
    "node-name": st.text(max_size=5) | json_values, "drv": st.sampled_from(
        ["qcow2", "host_device", "file"]) | json_values,
    "file": st.sampled_from([LV, "x"]) | json_values, "ro": st.booleans() | json_values,
    "write_threshold": st.integers() | json_values,
    "image": st.fixed_dictionaries({}, optional={"virtual-size": st.integers() | json_values})
    | json_values})


@given(nodes=st.lists(node_like, max_size=6) | json_values,
       stats=st.lists(json_values, max_size=4) | json_values)
def test_malformed_block_replies_never_raise(nodes: Any, stats: Any) -> None:
    for drive in thin_drives_from(nodes, stats):
        assert isinstance(drive.file_node, str) and isinstance(drive.allocation, int)


@given(status=json_values, block=json_values)
def test_malformed_status_replies_never_raise(status: Any, block: Any) -> None:
    state = run_state_from(status, block)
    assert isinstance(state.status, str)
