"""Thin drives whose device would hand ENOSPC to the guest.

Thin provisioning relies on QEMU pausing the VM when a write meets the end
of the LV (``werror=enospc``, the default, or ``stop``); a device set to
``report`` or ``ignore`` fails the guest's write instead. pvestord cannot
change that, so it says it: once per QEMU in the journal (``WERROR``), and
as the drive's problem in ``drives``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pvestord.adapters.qmp import VmMonitor
from pvestord.adapters.service import fields
from pvestord.adapters.vms import LocalVm
from pvestord.engine.drive import DriveCandidate
from pvestord.policy import device_on, hands_enospc_to_guest

log = logging.getLogger(__name__)


async def werror_risks(monitor: VmMonitor, drives: Sequence[DriveCandidate]) -> dict[str, str]:
    """The thin drives whose device hands ENOSPC to the guest: file node ->
    the device's ``werror``."""
    thin = [d for d in drives if d.storage is not None]
    if not thin:
        return {}
    risks: dict[str, str] = {}
    for device in await monitor.block_devices():
        on = [d for d in thin if device_on(device, d.identity)]
        if not on:
            continue
        werror = await monitor.write_error_action(device)
        if hands_enospc_to_guest(werror):
            assert werror is not None
            risks.update((d.view.file_node, werror) for d in on)
    return risks


def werror_problem(werror: str | None) -> str | None:
    """What ``drives`` shows for a drive whose device has ``werror``."""
    if werror is None:
        return None
    return (f"werror={werror}: ENOSPC at the end of the LV fails the guest's write instead "
            "of pausing the VM")


class WerrorWatch:
    """Each QEMU's devices looked at once: a device's error action is set
    when it is created."""

    def __init__(self) -> None:
        self._checked: set[tuple[int, int]] = set()

    def forget(self, vmid: int) -> None:
        self._checked = {k for k in self._checked if k[0] != vmid}

    def due(self, vm: LocalVm) -> bool:
        """Whether this QEMU's devices are still to be looked at."""
        return (vm.vmid, vm.pid) not in self._checked

    async def check_once(self, monitor: VmMonitor, vm: LocalVm,
                         drives: Sequence[DriveCandidate]) -> None:
        """Warn once per QEMU (vmid, pid) about each risky thin drive."""
        if not self.due(vm):
            return
        risks = await werror_risks(monitor, drives)
        self._checked.add((vm.vmid, vm.pid))
        for node, werror in sorted(risks.items()):
            log.warning("VM %d %s: its device has werror=%s: a write at the end of the LV "
                        "fails in the guest instead of pausing the VM until it grows (set "
                        "the disk's write error action to its default, enospc)",
                        vm.vmid, node, werror,
                        extra=fields(VMID=vm.vmid, BLOCK_NODE=node, WERROR=werror))
