"""Device-mapper state of this node's LVs: which are suspended, and putting
one left suspended back to work (:mod:`pvestord.policy.suspended`).

The state is read from sysfs (``/sys/block/dm-*/dm``: no process per look);
``dmsetup`` is run as any other command (:mod:`pvestord.adapters.command`:
argument list, timeout, checked output); ``PVESTORD_DMSETUP`` overrides the
binary, as ``PVESTORD_LVM`` does for ``lvm``.
"""

from __future__ import annotations

from pathlib import Path

from pvestord.adapters import lvm
from pvestord.adapters.command import binary, run_async
from pvestord.errors import CommandError, PvestordError
from pvestord.policy.suspended import DmDevice, parse_dm_info

#: ``dmsetup info`` and ``resume`` are ioctls on this node: quick, unless
#: the node itself is in trouble.
DMSETUP_TIMEOUT = 10.0


class DmError(PvestordError):
    """A device could not be read or resumed."""


#: Where the kernel shows each dm device's name and state.
SYS_BLOCK = Path("/sys/block")


def devices_in_sysfs(root: Path = SYS_BLOCK) -> list[DmDevice] | None:
    """The devices as ``/sys/block/dm-*/dm/{name,suspended}`` show them: no
    process, so the periodic look costs an idle node nothing. None when the
    kernel does not show them (then ``dmsetup`` is asked)."""
    found = []
    try:
        entries = sorted(root.glob("dm-*"))
        for entry in entries:
            try:
                name = (entry / "dm" / "name").read_text().strip()
                state = (entry / "dm" / "suspended").read_text().strip()
            except FileNotFoundError:
                if not entry.exists():
                    continue  # removed while we looked
                return None
            found.append(DmDevice(name, state == "1"))
    except OSError:
        return None
    return found


async def devices(*, timeout: float = DMSETUP_TIMEOUT,  # noqa: ASYNC109
                  sysfs: Path = SYS_BLOCK) -> list[DmDevice]:
    """Every device-mapper device of this node, and whether it is suspended.

    From sysfs when it shows them; else ``dmsetup info``, which reads state
    only: it never opens the devices, so a suspended one does not block it.
    """
    seen = devices_in_sysfs(sysfs)
    if seen is not None:
        return seen
    try:
        done = await run_async([binary("dmsetup"), "info", "-c", "--noheadings",
                                "-o", "name,suspended", "--separator", ":"], timeout=timeout)
    except CommandError as err:
        raise DmError(f"reading the device-mapper devices: {err}") from err
    return parse_dm_info(done.stdout)


async def resume_left_suspended(vg: str, lv: str, dm_name: str, *, lvm_timeout: float,
                                timeout: float = DMSETUP_TIMEOUT) -> str:  # noqa: ASYNC109
    """Bring ``vg/lv``, found suspended, back to work; how it was done.

    Not a bare ``dmsetup resume``: a command killed after it loaded its new
    table and suspended the device, but before it committed the metadata,
    leaves that new table loaded (inactive), and ``resume`` would make it
    live: a table larger than the metadata says, on extents another LV may
    be given (the AHEAD state). So:

    1. ``dmsetup clear`` drops the inactive table (it never was live, and
       the command that loaded it is gone), so that nothing below can make
       it live, whatever LVM does with a device it finds suspended already;
    2. ``lvchange --refresh`` loads the table from the committed metadata
       and resumes;
    3. if LVM cannot run, ``dmsetup resume`` brings back the live table the
       device had before the killed command (after 1, there is no other):
       I/O flows again, and a table behind the metadata is the reconcile
       pass's to refresh.
    """
    dmsetup = binary("dmsetup")
    try:
        await run_async([dmsetup, "clear", dm_name], timeout=timeout)
    except CommandError as err:
        cleared: CommandError | None = err
    else:
        cleared = None
    try:
        await lvm.refresh(vg, lv, timeout=lvm_timeout)
    except lvm.LvmError as refresh_error:
        if cleared is not None:
            raise DmError(f"LV {vg}/{lv} is left suspended: its inactive table could not be "
                          f"dropped ({cleared}) and refreshing it failed ({refresh_error})"
                          ) from refresh_error
        try:
            await run_async([dmsetup, "resume", dm_name], timeout=timeout)
        except CommandError as err:
            raise DmError(f"LV {vg}/{lv} is left suspended: refreshing it failed "
                          f"({refresh_error}), and so did dmsetup resume ({err})") from err
        return f"dmsetup clear and resume (the refresh failed: {refresh_error})"
    return "dmsetup clear and lvchange --refresh"
