"""A pvestord storage driven through Proxmox's real ``PVE::Storage``, in the node guest.

Real LVM on a loop device, Proxmox's own storage code from ``../shared/upstream``
with the stand-ins of ``tests/proxmox``, and the plugin asking the venv's
``pvestord plugin``; the helpers read what LVM and qemu-img say, never the
plugin's own view. Used by the node tests of the plugin's offline flows
(test_proxmox_plugin.py) and of a running VM's (test_proxmox_live.py,
test_block_jobs.py, test_lv_identity.py): those share :func:`live_storage`
(16 MiB chunks, 32 MiB new LVs, so a few MiB of writes cross a threshold) and
:func:`daemons_bed` (the daemons reading the same storage.cfg as Proxmox's code).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tests.harness import lvmbed
from tests.harness.daemons import VENV_BIN, NodeBed
from tests.harness.lvmbed import VG, GiB, MiB, loop_vg, sh
from tests.harness.qemu import Pve9Disk, QemuVM, image_io
from tests.proxmox import upstream

EXTENT = 4 * MiB
DISK = 4 * GiB
STORE = "thin1"
VMID = 100
VOLNAME = "vm-100-disk-0.qcow2"
VOLID = f"{STORE}:{VOLNAME}"
SNAP1 = "snap_vm-100-disk-0_snap1.qcow2"
SNAP2 = "snap_vm-100-disk-0_snap2.qcow2"
QEMU_IO_TIMEOUT = 300.0
#: The live tests' storage: chunk and new LV size.
CHUNK = 16 * MiB
INITIAL = 32 * MiB


@contextlib.contextmanager
def thin_storage(sources: upstream.Upstream, out_dir: Path, *, chunksize: int,
                 initial_size: int, options: Mapping[str, str] | None = None
                 ) -> Iterator[tuple[upstream.PerlSession, VG]]:
    """A fresh VG, a pvestord: storage on it, and Proxmox's PVE::Storage to drive.

    The session's Perl code sees ``$cfg``, Proxmox's parse of that storage.cfg.
    ``options``: more lines of the section (``{"pvestord-thin-critical-free": "2G"}``).
    The plugin's ``pvestord volume`` commands read that storage.cfg and take
    their storage locks in ``out_dir/locks`` (there is no /etc/pve here).
    """
    locks = out_dir / "locks"
    locks.mkdir(exist_ok=True)
    pvestord = out_dir / "pvestord"
    pvestord.write_text(
        "#!/bin/sh\n"
        f"if [ \"$1\" = volume ]; then exec {VENV_BIN / 'pvestord'} \"$@\""
        f" --storage-config {sources.pve_dir / 'storage.cfg'} --lock-dir {locks}; fi\n"
        f"exec {VENV_BIN / 'pvestord'} \"$@\"\n")
    pvestord.chmod(0o755)
    with loop_vg(6 * GiB) as vg:
        more = "".join(f"\t{name} {value}\n" for name, value in (options or {}).items())
        sources.write_storage_cfg(
            f"pvestord: {STORE}\n\tvgname {vg.name}\n\tcontent images\n\tshared 1\n"
            f"\tsnapshot-as-volume-chain 1\n\tpvestord-chunksize {chunksize // MiB}M\n"
            f"\tpvestord-chunk-percentage 0.5\n\tpvestord-initial-size {initial_size // MiB}M\n"
            f"{more}")
        session = sources.session(out_dir / "perl.log",
                                  PVESTORD_TEST_COMMAND=str(pvestord))
        try:
            yield session, vg
        finally:
            session.close()


def live_storage(sources: upstream.Upstream, out_dir: Path
                 ) -> contextlib.AbstractContextManager[tuple[upstream.PerlSession, VG]]:
    """:func:`thin_storage` with the live tests' :data:`CHUNK` and :data:`INITIAL`."""
    return thin_storage(sources, out_dir, chunksize=CHUNK, initial_size=INITIAL)


def daemons_bed(sources: upstream.Upstream, out_dir: Path, root: Path) -> NodeBed:
    """A node bed in ``root`` whose daemons read the storage.cfg that
    Proxmox's code in ``sources`` reads (:func:`thin_storage` wrote it)."""
    bed = NodeBed(root, logs_dir=out_dir)
    bed.storage_cfg.write_text((sources.pve_dir / "storage.cfg").read_text())
    return bed


def alloc_disk(pve: upstream.PerlSession) -> str:
    """``vdisk_alloc`` of the test disk, as ``qm set --scsi0 STORE:4`` does."""
    volid: str = pve.call(f'return [PVE::Storage::vdisk_alloc($cfg, "{STORE}", {VMID},'
                          f' "qcow2", undef, {DISK // 1024})];')[0]
    return volid


def snapshot(pve: upstream.PerlSession, snap: str) -> None:
    pve.call(f'PVE::Storage::volume_snapshot($cfg, "{VOLID}", "{snap}");')


def reopen_onto_snapshot(vm: QemuVM, vg: VG, disk: Pve9Disk,
                         snap: str) -> tuple[Pve9Disk, Pve9Disk]:
    """qemu-server's steps after the rename of a live snapshot
    (``blockdev_external_snapshot``): the snapshot's nodes, the throttle node
    reopened onto them (the old nodes go with their last parent), the new
    top under the disk's own node names, then the overlay. Returns (the
    snapshot's nodes, the new top's)."""
    snap_disk = Pve9Disk.for_volume(vg.lv_path(f"snap_vm-{VMID}-disk-0_{snap}.qcow2"), VOLID,
                                    snapshot=snap)
    vm.qmp("blockdev-add", snap_disk.format_blockdev())
    vm.qmp("blockdev-reopen", {"options": [disk.throttle_blockdev(snap_disk.block_node)]})
    top = Pve9Disk.for_volume(vg.lv_path(VOLNAME), VOLID)
    vm.qmp("blockdev-add", {**top.format_blockdev(), "backing": None})
    vm.qmp("blockdev-snapshot", node=snap_disk.block_node, overlay=top.block_node)
    return snap_disk, top


def lv_sizes(vg: VG) -> dict[str, int]:
    out = sh("lvs", "--reportformat", "json", "--units", "b", "--nosuffix", "-o",
             "lv_name,lv_size", vg.name)
    return {row["lv_name"]: int(row["lv_size"]) for row in json.loads(out)["report"][0]["lv"]}


def image(vg: VG, lv: str) -> dict[str, Any]:
    info: dict[str, Any] = json.loads(sh("qemu-img", "info", "--output=json", "-f", "qcow2",
                                         vg.lv_path(lv)))
    return info


def image_end(vg: VG, lv: str) -> int:
    return lvmbed.image_end_offset(vg.lv_path(lv))


def qemu_io(vg: VG, lv: str, command: str) -> None:
    """One ``qemu-io`` command on an LV no QEMU has open; any failure raises."""
    image_io(vg.lv_path(lv), command, timeout=QEMU_IO_TIMEOUT)


def overlay_maximum() -> int:
    """The maximum LV of a snapshot overlay of the test disk (Proxmox's layout)."""
    out = sh("qemu-img", "measure", "--output=json", "-O", "qcow2", "-o",
             "cluster_size=128k,extended_l2=on", "--size", str(DISK))
    return -(-int(json.loads(out)["fully-allocated"]) // EXTENT) * EXTENT
