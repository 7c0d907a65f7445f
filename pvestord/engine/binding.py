"""Each thin drive bound to the LV QEMU writes (:mod:`pvestord.policy.binding`).

Every look binds its drives again: a drive whose node's path still names the
device QEMU has open keeps its name, and that device is remembered; one whose
name moved away (Proxmox renamed the LV under the running QEMU) is given the
LV that device is now, so every later step (the sizes read, the extension,
the table check) works on the LV QEMU writes. The binding is checked once
more under the storage lock (:meth:`DeviceBindings.current_lv`), because
Proxmox renames under that same lock.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable

from pvestord.adapters import devices
from pvestord.adapters.service import fields
from pvestord.adapters.vms import LocalVm
from pvestord.engine.drive import DriveCandidate
from pvestord.engine.memory import OncePerChange, forget_vm
from pvestord.errors import PassDeferred
from pvestord.policy.binding import BindingKind, bind
from pvestord.policy.lvnames import chain_vmid

log = logging.getLogger(__name__)


class DriveLostError(PassDeferred):
    """A drive's node names no device QEMU has open, and none is remembered
    for it: which LV it writes is unknown, so its VM waits for the next look."""


class DeviceBindings:
    """The device each drive was last bound to by name, per QEMU process."""

    def __init__(self, said: OncePerChange) -> None:
        self._said = said
        #: (vmid, QEMU pid, file node) -> device number.
        self._devices: dict[tuple[int, int, str], int] = {}

    def forget(self, vmid: int) -> None:
        forget_vm(self._devices, vmid)

    def note_foreign_disk(self, vm: LocalVm, drive: DriveCandidate) -> None:
        """Say once that ``vm`` writes a disk named for another VM.

        Proxmox lets a user with ``Datastore.Allocate`` attach another VM's
        disk; it is grown as any drive of the VM that writes it (it would
        pause otherwise), and the journal says whose disk that was.
        """
        owner = chain_vmid(drive.lv)
        key = (vm.vmid, drive.lv, "foreign-disk")
        if owner is None or owner == vm.vmid:
            return
        self._said.say(key, logging.INFO,
                       "VM %d writes %s/%s, a disk named for VM %d: grown as any of its"
                       " drives", vm.vmid, drive.vg, drive.lv, owner,
                       extra=fields(VMID=vm.vmid, VG=drive.vg, LV=drive.lv, OWNER=owner))

    def bind(self, vm: LocalVm, found: Iterable[DriveCandidate]) -> list[DriveCandidate]:
        """``found`` with each drive's LV the one QEMU writes.

        Raises :class:`DriveLostError` when a thin drive's LV is unknown (a
        daemon started inside a rename's window): doing nothing for the VM
        beats growing an LV QEMU does not write.
        """
        open_devices = devices.open_block_devices(vm.pid)
        if open_devices is None:
            # Binding by name is what pvestord did before it could bind by
            # device: right but for a rename's window, which the config lock
            # still guards. Refusing every drive would leave guests paused.
            self._said.say((vm.vmid, "", "binding"), logging.WARNING,
                           "VM %d: cannot read /proc/%d/fd (run pvestord as root, without"
                           " hidepid): its drives are taken by their LV names", vm.vmid,
                           vm.pid, extra=fields(VMID=vm.vmid))
            return list(found)
        bound = []
        for candidate in found:
            if candidate.storage is None:
                bound.append(candidate)  # not thin: never grown, nothing to bind
                continue
            node = candidate.view.file_node
            key = (vm.vmid, vm.pid, node)
            binding = bind(devices.block_device(candidate.view.path), open_devices,
                           self._devices.get(key))
            if binding.kind is BindingKind.LOST:
                raise DriveLostError(
                    f"VM {vm.vmid} {node}: {candidate.view.path} is a device QEMU does not"
                    " have open and no earlier binding is known (an LV renamed under the"
                    " running VM): later")
            if binding.kind is BindingKind.NAME:
                if binding.device is not None:
                    self._devices[key] = binding.device
                self._said.over((vm.vmid, node, "binding"))
                bound.append(dataclasses.replace(candidate, device=binding.device))
                continue
            rebound = dataclasses.replace(candidate, device=binding.device)
            try:
                lv = self.current_lv(rebound)
            except DriveLostError:
                raise DriveLostError(f"VM {vm.vmid} {node}: the LV QEMU had open under"
                                     f" {candidate.view.path} is gone: later") from None
            self._said.say((vm.vmid, node, "binding"), logging.INFO,
                           "VM %d %s: %s now names another LV; QEMU writes LV %s/%s,"
                           " which is the one grown", vm.vmid, node, candidate.view.path,
                           candidate.vg, lv, extra=fields(VMID=vm.vmid, BLOCK_NODE=node,
                                                          LV=lv, VG=candidate.vg))
            bound.append(dataclasses.replace(rebound, lv=lv))
        return bound

    @staticmethod
    def current_lv(candidate: DriveCandidate) -> str:
        """The name of the LV ``candidate`` writes, read again now (under the
        storage lock, where Proxmox's renames happen).

        Raises :class:`DriveLostError` when its device is gone or left its VG.
        """
        if candidate.device is None:
            return candidate.lv
        lv = devices.lv_of_device(candidate.device)
        if lv is None or lv[0] != candidate.vg:
            raise DriveLostError(f"{candidate.view.path}: the LV QEMU had open is gone: later")
        return lv[1]
