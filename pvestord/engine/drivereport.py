"""``pvestord drives``: every thin-drive candidate of a VM, read afresh."""

from __future__ import annotations

from pvestord import policy
from pvestord.adapters import lvm
from pvestord.adapters.vms import LocalVm
from pvestord.engine.drive import DriveRow
from pvestord.engine.extender import Extender
from pvestord.engine.tables import table_problem
from pvestord.engine.werror import werror_problem, werror_risks
from pvestord.policy import ExtensionState, TableState


async def drive_reports(extender: Extender, vm: LocalVm) -> list[DriveRow]:
    """Every thin-drive candidate of ``vm`` with its LV read from LVM."""
    async with extender.monitor(vm) as monitor:
        found = extender.found((await monitor.block_nodes()).drives)
        run = await monitor.run_state()
        werror = await werror_risks(monitor, found)
    # LVM and qemu-img after the session: the VM's QMP socket serves one client.
    drives = await extender.figures.drives(found, fresh=True)
    reports = []
    for drive in drives:
        info = await lvm.lv_info(drive.vg, drive.lv, timeout=extender.settings.lvm_timeout)
        table = lvm.device_size(drive.vg, drive.lv)
        verdict = policy.table_state(info.size, table)
        paused = policy.paused_out_of_room(
            device_says_nospace=run.nospace_on(drive.view.path, drive.identity.block_nodes),
            unowned_pause=run.paused_on_unowned_error, lv_size=info.size,
            allocation=drive.view.allocation,
            chunksize=drive.storage.chunksize if drive.storage else 1)
        state = drive.state(lv_size=info.size, paused_nospace=paused)
        reports.append(DriveRow(
            vm.vmid, drive.view.file_node, drive.view.format_node, drive.view.path,
            drive.storage.storeid if drive.storage else None, info.size,
            table, drive.view.allocation, drive.view.threshold,
            drive.maximum, drive.view.virtual_size,
            policy.classify(state, extending=(vm.vmid, drive.view.file_node)
                            in extender.extending, failed=verdict is TableState.AHEAD)
            if drive.storage else ExtensionState.IDLE,
            table_problem(verdict, info.size, table) or werror_problem(
                werror.get(drive.view.file_node)) if drive.storage else None))
    return reports
