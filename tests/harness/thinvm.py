"""A VM on a thin LV of a node bed, as qemu-server would start it.

The node tier's engine tests and its live reduction tests share it: the LV
``vm-<vmid>-disk-<index>.qcow2`` on the bed's storage, a qcow2 on it, and
QEMU with Proxmox VE 9's block graph, connected to the bed's event socket.
"""

from __future__ import annotations

from tests.harness.daemons import NodeBed
from tests.harness.lvmbed import VG, GiB, MiB, qcow2_create
from tests.harness.qemu import Pve9Disk, QemuVM, pve9_disk


def thin_vm(bed: NodeBed, vg: VG, vmid: int, *, lv_size: int = 256 * MiB,
            virtual: int = 8 * GiB, index: int = 0, **kwargs: object) -> QemuVM:
    """A VM whose disk has Proxmox VE 9's block graph (``scsi<index>``:
    throttle over qcow2 ``f<hash>`` over host_device ``e<hash>``)."""
    lv = f"vm-{vmid}-disk-{index}.qcow2"
    path = vg.create_lv(lv, lv_size)
    qcow2_create(path, virtual)
    storeid = next(s.storeid for s in bed.storages if s.vgname == vg.name)
    disk = Pve9Disk.for_volume(path, f"{storeid}:{lv}", f"scsi{index}")
    return QemuVM(vmid, bed.run_dir, disks=[disk], event_socket=bed.event_socket,
                  log_path=bed.logs / f"qemu-{vmid}.log", **kwargs)  # type: ignore[arg-type]


def file_node(vm: QemuVM) -> str:
    """The host_device node of the VM's disk: where the threshold lives."""
    return pve9_disk(vm).file_block_node


def fmt_node(vm: QemuVM) -> str:
    """The qcow2 node of the VM's disk: where the writer writes."""
    return pve9_disk(vm).block_node


__all__ = ["file_node", "fmt_node", "thin_vm"]
