"""A template and a linked clone on a pvestord storage, through Proxmox's real PVE::Storage
(node guest; issue 37 item 5).

``qm template`` (qemu-server's ``template_create``: ``vdisk_create_base``)
makes the disk a read-only base; ``qm clone`` of it, linked (``clone_disk``:
``vdisk_clone``), makes a small overlay LV backed by the base's LV. A real
QEMU with Proxmox VE 9's block graph runs on the clone (QEMU opens the base
from the image's header, read-only, as for qemu-server's drive whose chain
``volume_snapshot_info`` ends at the clone), both daemons run, and a writer
writes past the clone's threshold: pvestord grows the clone's LV, never the
base's. ``clone_disk`` is a stand-in named as qemu-server's sub (qemu-server
cannot run here), so that the plugin sees the caller it sees in a real clone.

Real parts: LVM on a loop device, Proxmox's storage code with the stand-ins
of ``tests/proxmox``, QEMU, qemu-img, qmeventd-py and pvestord.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tests.harness.daemonlog import extensions
from tests.harness.daemons import daemons
from tests.harness.lvmbed import VG, GiB, MiB, qcow2_check, sh
from tests.harness.pacedwrite import EXTEND_TIMEOUT, paced_write
from tests.harness.polling import wait_until
from tests.harness.pvestorage import (
    CHUNK,
    INITIAL,
    STORE,
    VOLID,
    VOLNAME,
    alloc_disk,
    daemons_bed,
    image,
    live_storage,
    lv_sizes,
    overlay_maximum,
    qemu_io,
    thin_storage,
)
from tests.harness.qemu import Pve9Disk, QemuVM
from tests.proxmox import upstream

#: What the disk holds when it becomes a template.
BASE_DATA = 8 * MiB
#: What the clone's guest writes: three times the clone's first LV.
CLONE_DATA = 96 * MiB
CLONE_VMID = 101
BASE = "base-100-disk-0.qcow2"
BASE_VOLID = f"{STORE}:{BASE}"
CLONE_LV = "vm-101-disk-0.qcow2"
CLONE_VOLID = f"{STORE}:{BASE}/{CLONE_LV}"
START_TIMEOUT = 300.0

#: qemu-server's subs, as stand-ins that call PVE::Storage as they do.
QEMU_SERVER = (
    "sub PVE::QemuServer::template_create { my ($cfg, $volid) = @_;"
    " return PVE::Storage::vdisk_create_base($cfg, $volid) }"
    " sub PVE::QemuServer::clone_disk { my ($cfg, $volid, $vmid) = @_;"
    " return PVE::Storage::vdisk_clone($cfg, $volid, $vmid) }")


def free_error(pve: upstream.PerlSession, volid: str) -> str:
    """``vdisk_free``'s error, empty when it freed the volume."""
    error: str = pve.call(f'eval {{ PVE::Storage::vdisk_free($cfg, "{volid}") }}; return "$@";')
    return error


def lv_attr(vg: VG, lv: str) -> str:
    return sh("lvs", "--noheadings", "-o", "lv_attr", vg.lv_path(lv)).strip()


def checksum(vg: VG, lv: str) -> str:
    with open(vg.lv_path(lv), "rb") as device:
        return hashlib.file_digest(device, "sha256").hexdigest()


def test_a_linked_clone_grows_thin_on_its_read_only_base(
        sources: upstream.Upstream, out_dir: Path, tmp_path: Path) -> None:
    with live_storage(sources, out_dir) as (pve, vg):
        alloc_disk(pve)
        qemu_io(vg, VOLNAME, f"write -P 0x11 0 {BASE_DATA}")

        # qm template: the same LV, renamed and read-only.
        made = pve.call(f'{QEMU_SERVER} return [PVE::QemuServer::template_create($cfg,'
                        f' "{VOLID}")];')
        assert made == [BASE_VOLID]
        assert lv_sizes(vg) == {BASE: INITIAL}
        assert lv_attr(vg, BASE)[1] == "r"
        base_sum = checksum(vg, BASE)

        # qm clone, linked: a thin overlay on the base's device.
        made = pve.call(f'{QEMU_SERVER} return [PVE::QemuServer::clone_disk($cfg,'
                        f' "{BASE_VOLID}", {CLONE_VMID})];')
        assert made == [CLONE_VOLID]
        assert lv_sizes(vg) == {BASE: INITIAL, CLONE_LV: INITIAL}
        assert image(vg, CLONE_LV)["backing-filename"] == vg.lv_path(BASE)
        listed = pve.call(f'return PVE::Storage::vdisk_list($cfg, "{STORE}");')[STORE]
        assert {(v["volid"], v.get("parent")) for v in listed} == {
            (BASE_VOLID, None), (CLONE_VOLID, BASE_VOLID)}
        assert "still in use by linked clones" in free_error(pve, BASE_VOLID)

        # The clone's VM starts (qemu-server activates its volumes first).
        pve.call(f'PVE::Storage::activate_volumes($cfg, ["{CLONE_VOLID}"]); return 1;')
        bed = daemons_bed(sources, out_dir, tmp_path / "bed")
        bed.write_vm_config(CLONE_VMID, CLONE_VOLID)
        disk = Pve9Disk.for_volume(vg.lv_path(CLONE_LV), CLONE_VOLID)
        with daemons(bed, start_timeout=START_TIMEOUT) as (_, pvestord), \
                QemuVM(CLONE_VMID, bed.run_dir, disks=[disk], event_socket=bed.event_socket,
                       log_path=out_dir / "qemu-clone.log") as vm:
            wait_until(lambda: vm.named_node(disk.file_block_node)["write_threshold"] != 0,
                       START_TIMEOUT, "the clone's top armed by the first reconcile")
            base_nodes = [n for n in vm.qmp("query-named-block-nodes", flat=True)
                          if n.get("file") == vg.lv_path(BASE)]
            assert base_nodes, "QEMU opened the base as the clone's backing file"
            assert all(n["ro"] and not n.get("write_threshold") for n in base_nodes)
            outcome = paced_write(vm, disk.block_node, GiB, CLONE_DATA, 0x22)
            assert outcome.errors == []
            wait_until(lambda: bed.entries() == [], EXTEND_TIMEOUT, "queue drained")
            assert vm.read_verify(disk.block_node, 0, BASE_DATA, 0x11)
            assert vm.read_verify(disk.block_node, GiB, CLONE_DATA, 0x22)
            assert extensions(pvestord.log_text(), LV=CLONE_LV)
            assert extensions(pvestord.log_text(), LV=BASE) == []

        grown = lv_sizes(vg)[CLONE_LV]
        assert CLONE_DATA < grown <= overlay_maximum()
        assert qcow2_check(vg.lv_path(CLONE_LV))["exit"] == 0
        qemu_io(vg, CLONE_LV, f"read -P 0x11 0 {BASE_DATA}")
        qemu_io(vg, CLONE_LV, f"read -P 0x22 {GiB} {CLONE_DATA}")
        # The base: untouched, still read-only.
        assert lv_sizes(vg)[BASE] == INITIAL
        assert checksum(vg, BASE) == base_sum
        assert lv_attr(vg, BASE)[1] == "r"
        assert qcow2_check(vg.lv_path(BASE))["exit"] == 0

        # The VM stopped: its volumes are deactivated, the base with the last clone.
        pve.call(f'PVE::Storage::deactivate_volumes($cfg, ["{CLONE_VOLID}"]); return 1;')
        assert lv_attr(vg, BASE)[4] == "-"
        assert lv_attr(vg, CLONE_LV)[4] == "-"

        assert "still in use by linked clones" in free_error(pve, BASE_VOLID)
        assert lv_sizes(vg) == {BASE: INITIAL, CLONE_LV: grown}
        assert free_error(pve, CLONE_VOLID) == ""
        assert free_error(pve, BASE_VOLID) == ""
        assert lv_sizes(vg) == {}
        print(f"MEASURED base LV {INITIAL} (template of a disk holding {BASE_DATA}),"
              f" clone LV {INITIAL} -> {grown} after {CLONE_DATA} written"
              f" (chunk {CHUNK}, maximum {overlay_maximum()})")


def test_a_full_clone_of_a_template_is_a_copy_reduced_after_it(
        sources: upstream.Upstream, out_dir: Path) -> None:
    """qemu-server's offline full clone: ``vdisk_alloc`` from ``clone_disk``
    (thick, a copy target), the base activated as the source, ``qemu-img
    convert``, ``deactivate_volumes`` of the new volume (reduced then)."""
    with live_storage(sources, out_dir) as (pve, vg):
        alloc_disk(pve)
        qemu_io(vg, VOLNAME, f"write -P 0x11 0 {BASE_DATA}")
        pve.call(f'{QEMU_SERVER} return [PVE::QemuServer::template_create($cfg, "{VOLID}")];')
        base_sum = checksum(vg, BASE)
        copy = pve.call(
            "sub PVE::QemuServer::clone_disk { my ($cfg, $vmid, $size) = @_;"
            ' return PVE::Storage::vdisk_alloc($cfg, "thin1", $vmid, "qcow2", undef, $size) }'
            f' my $size = PVE::Storage::volume_size_info($cfg, "{BASE_VOLID}");'
            f' return [PVE::QemuServer::clone_disk($cfg, {CLONE_VMID}, $size / 1024)];')[0]
        assert copy == f"{STORE}:{CLONE_LV}"
        thick = lv_sizes(vg)[CLONE_LV]
        assert thick > INITIAL
        pve.call(f'PVE::Storage::activate_volumes($cfg, ["{BASE_VOLID}", "{copy}"]); return 1;')
        sh("qemu-img", "convert", "-n", "--target-is-zero", "-f", "qcow2", "-O", "qcow2",
           vg.lv_path(BASE), vg.lv_path(CLONE_LV), timeout=600)
        pve.call(f'PVE::Storage::deactivate_volumes($cfg, ["{copy}", "{BASE_VOLID}"]);'
                 ' return 1;')
        reduced = lv_sizes(vg)[CLONE_LV]
        assert reduced == INITIAL
        # Deactivated by its own deactivation, the base with it: read again.
        assert lv_attr(vg, BASE)[4] == "-"
        sh("lvchange", "-ay", vg.lv_path(CLONE_LV))
        sh("lvchange", "-ay", vg.lv_path(BASE))
        assert "backing-filename" not in image(vg, CLONE_LV)
        qemu_io(vg, CLONE_LV, f"read -P 0x11 0 {BASE_DATA}")
        assert qcow2_check(vg.lv_path(CLONE_LV))["exit"] == 0
        assert checksum(vg, BASE) == base_sum
        # Not a linked clone: the base may go.
        assert free_error(pve, BASE_VOLID) == ""
        print(f"MEASURED full clone of a template: LV {thick} while copying, {reduced} after")


#: vdisk_free hands saferemove's zeroing to a worker (fork_worker), as root
#: (pvesm's user); it runs at once here, its output to stderr (the session's
#: answers are on stdout).
WORKER_INLINE = (
    "PVE::RPCEnvironment::get()->set_user('root@pam');"
    ' no warnings "redefine"; local *PVE::RPCEnvironment::fork_worker = sub {'
    ' my ($self, $type, $id, $user, $worker) = @_;'
    ' my $out = select(STDERR); $worker->(); select($out); return "UPID:t"; };')


def lv_bytes_on_pv(vg: VG, lv: str) -> tuple[Path, int, int]:
    """Where ``lv``'s one segment lies on the VG's loop PV: (backing file, offset, size)."""
    [pv] = vg.pvs
    row = json.loads(sh("lvs", "--reportformat", "json", "--units", "b", "--nosuffix", "-o",
                        "devices,lv_size", f"{vg.name}/{lv}"))["report"][0]["lv"][0]
    device, first_extent = row["devices"].rstrip(")").split("(")
    assert device == pv.device, "one segment, on the loop PV"
    pe_start = int(json.loads(sh("pvs", "--reportformat", "json", "--units", "b", "--nosuffix",
                                 "-o", "pe_start", pv.device))["report"][0]["pv"][0]["pe_start"])
    return pv.backing, pe_start + int(first_extent) * vg.extent_size(), int(row["lv_size"])


def read_range(path: Path, offset: int, size: int) -> bytes:
    with path.open("rb") as backing:
        backing.seek(offset)
        return backing.read(size)


def test_a_template_on_a_saferemove_storage_is_zeroed_before_it_goes(
        sources: upstream.Upstream, out_dir: Path) -> None:
    """``saferemove`` zeroes a freed LV before removing it, and the zeroing only
    warns when it fails: a base, read-only, would keep its data on the SAN.
    The plugin makes a base writable first; the extents it held read back as zeros."""
    with thin_storage(sources, out_dir, chunksize=CHUNK, initial_size=INITIAL,
                      options={"saferemove": "1"}) as (pve, vg):
        alloc_disk(pve)
        qemu_io(vg, VOLNAME, f"write -P 0x11 0 {BASE_DATA}")
        pve.call(f'{QEMU_SERVER} return [PVE::QemuServer::template_create($cfg, "{VOLID}")];')
        assert lv_attr(vg, BASE)[1] == "r"
        backing, offset, size = lv_bytes_on_pv(vg, BASE)
        held = read_range(backing, offset, size)
        assert held.startswith(b"QFI\xfb") and b"\x11" * 4096 in held

        freed = pve.call(f'{WORKER_INLINE} eval {{ PVE::Storage::vdisk_free($cfg,'
                         f' "{BASE_VOLID}") }}; return "$@";')
        assert freed == ""
        assert lv_sizes(vg) == {}
        assert read_range(backing, offset, size) == bytes(size)
        print(f"MEASURED saferemove of a base: {size} bytes at PV offset {offset} zeroed")
