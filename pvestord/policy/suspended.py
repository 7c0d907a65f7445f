"""Which LVs left suspended to resume (docs/operations.md, "An LV left suspended").

An ``lvextend`` or ``lvchange --refresh`` reloads an LV's device-mapper table
in three steps: load the new table (inactive), suspend the device, resume it
(the new table goes live). A command killed between the suspend and the
resume (its timeout, its pass cancelled) leaves the device suspended: every
I/O on it queues, the guest hangs, and QEMU still says ``running``.

A suspension is also an ordinary moment of any LVM change on this node (ours
while it runs, Proxmox's own ``lvchange``), so seeing one is no proof of a
leftover. An LV is resumed only when

- it belongs to a VG of ours that is not marked unhealthy (an ``lvm`` that
  SIGKILL did not end may still resume it itself; we do not race it),
- no LVM change of ours runs for its VM, and
- it has been seen suspended, without a break, for at least ``grace``
  (longer than any healthy suspend/resume window), or our own command on it
  was killed and has ended (we know the suspension is its leftover).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pvestord.policy.binding import split_dm_name
from pvestord.policy.lvnames import chain_vmid

#: How long a suspension must last before it is taken for a leftover. An
#: LVM change holds its LV suspended for milliseconds (a metadata write on a
#: slow SAN: seconds); 30 s is longer than our own change budget allows.
GRACE = 30.0


@dataclass(frozen=True)
class DmDevice:
    """One line of ``dmsetup info -c --noheadings -o name,suspended``."""

    name: str
    suspended: bool


def parse_dm_info(text: str, separator: str = ":") -> list[DmDevice]:
    """``dmsetup info -c --noheadings -o name,suspended --separator :``'s
    lines (``vg-vm--100--disk--0.qcow2:Suspended``); malformed lines are
    skipped (an LV name never holds the separator)."""
    devices = []
    for line in text.splitlines():
        name, sep, state = line.strip().rpartition(separator)
        if not sep or not name or state not in ("Active", "Suspended"):
            continue
        devices.append(DmDevice(name, state == "Suspended"))
    return devices


@dataclass(frozen=True)
class SuspendedLv:
    """A VM disk LV of ours whose device is suspended."""

    vg: str
    lv: str
    dm_name: str
    vmid: int


def ours(devices: Iterable[DmDevice], vgs: Iterable[str]) -> list[SuspendedLv]:
    """The suspended devices that are VM disk LVs on ``vgs``."""
    wanted = set(vgs)
    found = []
    for device in devices:
        if not device.suspended:
            continue
        split = split_dm_name(device.name)
        if split is None or split[0] not in wanted:
            continue
        vmid = chain_vmid(split[1])
        if vmid is not None:
            found.append(SuspendedLv(split[0], split[1], device.name, vmid))
    return found


@dataclass(frozen=True)
class Verdict:
    """What to do now, and the sightings to remember for next time."""

    resume: tuple[SuspendedLv, ...]
    #: Suspended, but not (yet) ours to resume: the reason, by dm name.
    waiting: Mapping[str, str]
    #: dm name -> when first seen suspended (monotonic), for the next look.
    seen: Mapping[str, float]


def judge(suspended: Iterable[SuspendedLv], *, now: float, seen: Mapping[str, float],
          changing: Iterable[int], unhealthy: Iterable[str], killed: Iterable[str] = (),
          grace: float = GRACE) -> Verdict:
    """Which of the ``suspended`` LVs to resume now.

    ``seen``: when each was first seen suspended (from the last verdict);
    ``changing``: VMs with an LVM change of ours running; ``unhealthy``: VGs
    marked; ``killed``: dm names of LVs whose change of ours was killed and
    has ended since.
    """
    busy, marked, ours_killed = set(changing), set(unhealthy), set(killed)
    resume: list[SuspendedLv] = []
    waiting: dict[str, str] = {}
    still: dict[str, float] = {}
    for lv in suspended:
        first = seen.get(lv.dm_name, now)
        still[lv.dm_name] = first
        if lv.vg in marked:
            waiting[lv.dm_name] = f"VG {lv.vg} is marked unhealthy"
        elif lv.vmid in busy:
            waiting[lv.dm_name] = f"an LVM change of ours runs for VM {lv.vmid}"
        elif lv.dm_name in ours_killed or now - first >= grace:
            resume.append(lv)
        else:
            waiting[lv.dm_name] = f"suspended for {now - first:.0f} s, less than {grace:g} s"
    return Verdict(tuple(resume), waiting, still)
