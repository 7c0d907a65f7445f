"""LVM, as commands: JSON reports, argument lists, timeouts, typed errors.

Only what pvestord needs: read an LV's and its VG's sizes, grow an LV to an
absolute size, and refresh an LV's device-mapper table (after another node
grew it). Every command runs with a ``--config`` that skips work an
``lvextend`` of a linear LV does not need (docs/design.md, "LVM", has the figures).
The two commands of an extension (:func:`lv_info`, :func:`extend`) can run
in a persistent ``lvm`` shell instead of a process each
(:mod:`pvestord.adapters.lvmshell`); everything else is rare and runs as a process.

Why absolute sizes (``-L <bytes>b``) and never ``+N``: an extension is
retried after crashes and timeouts, and "grow to X" is idempotent where
"grow by N" is not.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pvestord.adapters import budgets
from pvestord.adapters.command import Completed, binary
from pvestord.adapters.lvmshell import LvmShellError, LvmShells, run_lvm_process
from pvestord.errors import CommandError, PvestordError
from pvestord.policy.proxmox import is_lvm_name

log = logging.getLogger(__name__)

#: Budget for a report (``lvs``/``vgs``): :data:`pvestord.adapters.budgets.LVM_REPORT`.
REPORT_TIMEOUT = budgets.LVM_REPORT
#: Budget for a metadata change, run under the storage lock:
#: :data:`pvestord.adapters.budgets.LVM_CHANGE`.
CHANGE_TIMEOUT = budgets.LVM_CHANGE

#: Settings that are safe for the linear LVs we read, create and resize, and
#: skip work those commands do not need:
#: - scan /dev directly instead of asking udev for the device list;
#: - no dmeventd monitoring and no lvmpolld: both serve mirror, snapshot, thin
#:   pool and pvmove LVs, never a linear LV.
#: Not used, although they measured faster (docs/design.md, "LVM"):
#: - ``udev_rules = 0`` / ``udev_sync = 0``: where udev runs (every Proxmox
#:   node), the table reload of a resize sends udev a change event flagged
#:   "rules disabled", and udev then drops ``/dev/VG/LV``: seen in the node
#:   guest after an ``lvextend`` and an ``lvreduce``. QEMU keeps its open
#:   descriptor, but the next ``qm start`` or backup finds no device.
#: - ``--nolocking``: gained nothing and would drop LVM's own local lock.
FAST_CONFIG = (
    "activation { monitoring = 0 } "
    "devices { obtain_device_list_from_udev = 0 } "
    "global { use_lvmpolld = 0 }"
)


class LvmError(PvestordError):
    """An LVM command failed (the :class:`CommandError`, if any, is its ``__cause__``)."""


class VgFullError(LvmError):
    """The VG has too few free extents for the requested size."""


class LvMissingError(LvmError):
    """The LV (or its VG) does not exist on this node."""


class LvmLockError(LvmError):
    """LVM could not take its own lock (another LVM command holds it)."""


def check_name(kind: str, name: str) -> str:
    """Refuse names LVM would refuse, before they reach a command line."""
    if not is_lvm_name(name):
        raise LvmError(f"invalid {kind} name {name!r}")
    return name


@dataclass(frozen=True)
class LvInfo:
    vg: str
    lv: str
    size: int
    extent_size: int
    vg_free: int
    active: bool
    open: bool
    #: The LV's tags (VG metadata: the same on every node).
    tags: tuple[str, ...] = ()

    @property
    def path(self) -> str:
        return f"/dev/{self.vg}/{self.lv}"


def lv_from_path(path: str) -> tuple[str, str] | None:
    """``/dev/VG/LV`` -> ``(VG, LV)``; None for any other kind of path."""
    parts = path.split("/")
    if len(parts) == 4 and parts[0] == "" and parts[1] == "dev":
        vg, lv = parts[2], parts[3]
        if is_lvm_name(vg) and is_lvm_name(lv) and vg not in ("mapper", "disk"):
            return vg, lv
    return None


def _argv(command: str, *args: str) -> list[str]:
    return [binary("lvm"), command, "--config", FAST_CONFIG, *args]


def _classify(err: CommandError, what: str) -> LvmError:
    text = err.stderr
    if err.timed_out:
        return LvmError(f"{what}: {err}")
    if "Insufficient free space" in text or "insufficient free extents" in text.lower():
        return VgFullError(f"{what}: volume group is full: {_last_line(text)}")
    if "Failed to find logical volume" in text or "not found in volume group" in text or (
            "Volume group" in text and "not found" in text):
        return LvMissingError(f"{what}: {_last_line(text)}")
    if "lock" in text.lower() and ("timeout" in text.lower() or "busy" in text.lower()):
        return LvmLockError(f"{what}: {_last_line(text)}")
    return LvmError(f"{what}: {err}")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no message)"


async def _run(argv: list[str], vg: str, *, timeout: float,  # noqa: ASYNC109
               shells: LvmShells | None) -> Completed:
    """``argv`` as a process, or in ``vg``'s shell when there are ``shells``."""
    if shells is None:
        return await run_lvm_process(argv, timeout=timeout)
    try:
        return await shells.run(vg, argv, timeout=timeout)
    except LvmShellError as err:
        raise CommandError(argv, None, str(err)) from err


async def lv_info(vg: str, lv: str, *, timeout: float = REPORT_TIMEOUT,  # noqa: ASYNC109
                  shells: LvmShells | None = None) -> LvInfo:
    """Sizes and state of one LV, as this node's LVM metadata says."""
    check_name("VG", vg)
    check_name("LV", lv)
    argv = _argv("lvs", "--reportformat", "json", "--units", "b", "--nosuffix",
                 "-o", "vg_name,lv_name,lv_size,vg_extent_size,vg_free,lv_active,lv_device_open,"
                 "lv_tags", f"{vg}/{lv}")
    try:
        done = await _run(argv, vg, timeout=timeout, shells=shells)
    except CommandError as err:
        raise _classify(err, f"reading LV {vg}/{lv}") from err
    rows = _report_rows(done.stdout, "lv")
    if not rows:
        raise LvMissingError(f"reading LV {vg}/{lv}: no such LV")
    row = rows[0]
    return LvInfo(
        vg=row["vg_name"], lv=row["lv_name"], size=int(row["lv_size"]),
        extent_size=int(row["vg_extent_size"]), vg_free=int(row["vg_free"]),
        active=row.get("lv_active", "") == "active",
        open=row.get("lv_device_open", "") == "open",
        tags=_tags(row),
    )


#: What a resize to an absolute size says when the LV has that size already
#: (a retried command that had its effect): lvm2 2.03.16 "New size (N extents)
#: matches existing size (N extents).", 2.03.31 (Proxmox VE 9's) "No size
#: change.", both with status 5.
SIZE_UNCHANGED = ("matches existing size", "No size change.")


async def _change(vg: str, lv: str, what: str, command: str, *args: str,
                  done_if: Sequence[str] = (), timeout: float = CHANGE_TIMEOUT,  # noqa: ASYNC109
                  shells: LvmShells | None = None) -> None:
    """Run one metadata-changing ``command`` on ``vg/lv``; map its failure to a typed error.

    ``done_if``: messages that mean a retried command already had its effect
    (an absolute size the LV already has), which is success.
    """
    check_name("VG", vg)
    check_name("LV", lv)
    try:
        await _run(_argv(command, "-q", *args, f"{vg}/{lv}"), vg, timeout=timeout,
                   shells=shells)
    except CommandError as err:
        if any(message in err.stderr for message in done_if):
            return
        raise _classify(err, what) from err


async def extend(vg: str, lv: str, size: int, *, timeout: float = CHANGE_TIMEOUT,  # noqa: ASYNC109
                 shells: LvmShells | None = None) -> None:
    """Grow ``vg/lv`` to exactly ``size`` bytes (extent-aligned by the caller).

    Callers hold the storage lock: LVM's own lock is per node, and two nodes
    writing one VG's metadata at once lose an extension (docs/design.md, "Locks").
    """
    await _change(vg, lv, f"extending LV {vg}/{lv} to {size} bytes", "lvextend",
                  "--size", f"{size}b", done_if=SIZE_UNCHANGED, timeout=timeout,
                  shells=shells)


def device_size(vg: str, lv: str) -> int:
    """The size of ``/dev/VG/LV`` as this node's device-mapper table has it.

    It lags the metadata when another node grew the LV (until a refresh);
    QEMU's own figure for a ``host_device`` node is no help here, as QEMU 7.2
    does not re-read it after the device grows.
    """
    path = f"/dev/{check_name('VG', vg)}/{check_name('LV', lv)}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as err:
        raise LvMissingError(f"cannot open {path}: {err.strerror}") from err
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)


async def refresh(vg: str, lv: str, *, timeout: float = CHANGE_TIMEOUT) -> None:  # noqa: ASYNC109
    """Reload ``vg/lv``'s device-mapper table from the metadata (another node grew it)."""
    await _change(vg, lv, f"refreshing LV {vg}/{lv}", "lvchange", "--refresh", timeout=timeout)


def _report_rows(stdout: str, kind: str) -> list[dict[str, Any]]:
    try:
        report = json.loads(stdout)
        rows: list[dict[str, Any]] = report["report"][0][kind]
    except (ValueError, KeyError, IndexError, TypeError) as err:
        raise LvmError(f"unreadable LVM report: {stdout[:200]!r}") from err
    return rows


# ---------------------------------------------------------------------------
# Volume life cycle: listing, creating, activating and reducing LVs.
#
# Added for ``pvestord volume`` (pvestord/features/volumes/). They use the same
# FAST_CONFIG as the daemon's commands: it leaves udev synchronisation on,
# which creating, activating and resizing LVs need.


@dataclass(frozen=True)
class VgInfo:
    vg: str
    extent_size: int
    free: int


@dataclass(frozen=True)
class LvRow:
    """One LV of a VG as ``lvs`` reports it."""

    vg: str
    lv: str
    size: int
    tags: tuple[str, ...]
    active: bool
    open: bool
    #: ``lv_attr`` first character: ``-`` linear, ``m``/``r``... (Proxmox lists ``-mMrR``).
    type_char: str


async def _vg_row(vg: str, columns: str, *, timeout: float = REPORT_TIMEOUT,  # noqa: ASYNC109
                  shells: LvmShells | None = None) -> dict[str, Any]:
    """``vgs -o columns vg``'s one row; :class:`LvMissingError` if this node cannot see ``vg``."""
    check_name("VG", vg)
    argv = _argv("vgs", "--reportformat", "json", "--units", "b", "--nosuffix",
                 "-o", columns, vg)
    try:
        done = await _run(argv, vg, timeout=timeout, shells=shells)
    except CommandError as err:
        raise _classify(err, f"reading VG {vg}") from err
    rows = _report_rows(done.stdout, "vg")
    if not rows:
        raise LvMissingError(f"reading VG {vg}: no such volume group")
    return rows[0]


async def vg_info(vg: str) -> VgInfo:
    """Extent size and free bytes of ``vg``."""
    row = await _vg_row(vg, "vg_name,vg_extent_size,vg_free")
    return VgInfo(vg=row["vg_name"], extent_size=int(row["vg_extent_size"]),
                  free=int(row["vg_free"]))


@dataclass(frozen=True)
class VgProbe:
    """How a VG looks from this node: for the node report (:mod:`pvestord.engine.nodereport`)."""

    vg: str
    pvs: int
    #: PVs the metadata names that this node cannot find (a failed path).
    missing_pvs: int
    free: int
    extent_size: int
    #: Room left for the VG's metadata text, as ``vg_mda_free`` reports it: LVM
    #: keeps the old copy while it writes the new one, so this is already what
    #: the next writes may use (at most about half of ``mda_size``). 0 if unknown.
    mda_free: int = 0
    #: ``vg_mda_size``: the size of the VG's (smallest) metadata area.
    mda_size: int = 0


async def probe_vg(vg: str, *, timeout: float = REPORT_TIMEOUT,  # noqa: ASYNC109
                    shells: LvmShells | None = None) -> VgProbe:
    """PV counts, free space and metadata room of ``vg``; :class:`LvMissingError` if this
    node cannot see it."""
    row = await _vg_row(vg, "vg_name,vg_free,vg_extent_size,pv_count,vg_missing_pv_count,"
                        "vg_mda_free,vg_mda_size", timeout=timeout, shells=shells)
    try:
        return VgProbe(vg=row["vg_name"], pvs=int(row["pv_count"]),
                        missing_pvs=int(row["vg_missing_pv_count"]), free=int(row["vg_free"]),
                        extent_size=int(row["vg_extent_size"]),
                        mda_free=int(row["vg_mda_free"]), mda_size=int(row["vg_mda_size"]))
    except (KeyError, ValueError) as err:
        raise LvmError(f"reading VG {vg}: unreadable report row {row!r}") from err


def _tags(row: Mapping[str, Any]) -> tuple[str, ...]:
    """An ``lvs`` row's ``lv_tags``: LVM joins them with commas (a comma is
    not allowed in a tag)."""
    return tuple(t for t in str(row.get("lv_tags", "")).split(",") if t)


async def list_lvs(vg: str, *, timeout: float = REPORT_TIMEOUT,  # noqa: ASYNC109
                   shells: LvmShells | None = None) -> list[LvRow]:
    """Every LV of ``vg``, by name."""
    check_name("VG", vg)
    argv = _argv("lvs", "--reportformat", "json", "--units", "b", "--nosuffix",
                 "-o", "vg_name,lv_name,lv_size,lv_tags,lv_active,lv_device_open,lv_attr", vg)
    try:
        done = await _run(argv, vg, timeout=timeout, shells=shells)
    except CommandError as err:
        raise _classify(err, f"listing LVs of {vg}") from err
    rows = []
    for row in _report_rows(done.stdout, "lv"):
        rows.append(LvRow(
            vg=row["vg_name"], lv=row["lv_name"], size=int(row["lv_size"]), tags=_tags(row),
            active=row.get("lv_active", "") == "active",
            open=row.get("lv_device_open", "") == "open",
            type_char=str(row.get("lv_attr", "-"))[:1] or "-"))
    return sorted(rows, key=lambda r: r.lv)


async def create(vg: str, lv: str, size: int, tags: tuple[str, ...] = ()) -> None:
    """``lvcreate`` with the flags of Proxmox's ``PVE::Storage::LVMPlugin::lvcreate``.

    ``-aly`` (active on this node), ``-Wy`` (wipe signatures found at the
    start of the new LV: a stale qcow2 header there must not survive),
    ``--yes`` (never prompt), ``--setautoactivation n`` (not activated at
    boot on every node of a shared VG). Callers hold the storage lock.
    """
    check_name("VG", vg)
    check_name("LV", lv)
    argv = _argv("lvcreate", "-q", "-aly", "-Wy", "--yes", "--size", f"{size}b",
                       "--name", lv, "--setautoactivation", "n")
    for tag in tags:
        argv += ["--addtag", tag]
    argv.append(vg)
    try:
        await run_lvm_process(argv, timeout=CHANGE_TIMEOUT)
    except CommandError as err:
        raise _classify(err, f"creating LV {vg}/{lv} of {size} bytes") from err


async def add_tags(vg: str, lv: str, tags: Sequence[str]) -> None:
    """``lvchange --addtag`` each of ``tags`` (VG metadata: callers hold the
    storage lock, as for :func:`extend`). A tag already there is kept once."""
    args = [arg for tag in tags for arg in ("--addtag", tag)]
    await _change(vg, lv, f"tagging LV {vg}/{lv}", "lvchange", *args)


async def remove_tags(vg: str, lv: str, tags: Sequence[str], *,
                      timeout: float = CHANGE_TIMEOUT) -> None:  # noqa: ASYNC109
    """``lvchange --deltag`` each of ``tags`` (VG metadata: callers hold the
    storage lock, as for :func:`extend`). A tag not there is no error."""
    args = [arg for tag in tags for arg in ("--deltag", tag)]
    await _change(vg, lv, f"untagging LV {vg}/{lv}", "lvchange", *args, timeout=timeout)


async def remove(vg: str, lv: str) -> None:
    """``lvremove -f``: only for an LV this process has just created."""
    await _change(vg, lv, f"removing LV {vg}/{lv}", "lvremove", "-f")


async def activate(vg: str, lv: str) -> None:
    """``lvchange -aey``, as Proxmox's ``activate_volume``."""
    await _change(vg, lv, f"activating LV {vg}/{lv}", "lvchange", "-aey")


async def deactivate(vg: str, lv: str) -> None:
    """``lvchange -aln``, as Proxmox's ``deactivate_volume``."""
    await _change(vg, lv, f"deactivating LV {vg}/{lv}", "lvchange", "-aln")


async def reduce(vg: str, lv: str, size: int, *,
                 timeout: float = CHANGE_TIMEOUT) -> None:  # noqa: ASYNC109
    """Shrink ``vg/lv`` to exactly ``size`` bytes (extent-aligned by the caller).

    ``-f`` because lvreduce otherwise asks for confirmation (it cannot know
    what lies past the new end; the caller proved nothing does). Callers
    hold the storage lock, as for :func:`extend`.
    """
    await _change(vg, lv, f"reducing LV {vg}/{lv} to {size} bytes", "lvreduce", "-f",
                  "--size", f"{size}b", done_if=SIZE_UNCHANGED, timeout=timeout)


async def vg_space(vg: str, *, timeout: float = REPORT_TIMEOUT,  # noqa: ASYNC109
                   shells: LvmShells | None = None) -> tuple[int, int]:
    """``vg``'s size and free bytes, for its capacity account."""
    row = await _vg_row(vg, "vg_name,vg_size,vg_free", timeout=timeout, shells=shells)
    return int(row["vg_size"]), int(row["vg_free"])


@dataclass(frozen=True)
class PvMetadata:
    """One PV's metadata area, as ``pvs`` reports it (for ``pvestord check``)."""

    pv: str
    #: "" for a PV in no VG.
    vg: str
    #: ``pv_mda_size``: 0 for a PV made with ``--metadatacopies 0``.
    mda_size: int
    mda_free: int
    vg_size: int


async def pv_metadata(*, timeout: float = REPORT_TIMEOUT) -> list[PvMetadata]:  # noqa: ASYNC109
    """Every PV this node sees, with its metadata area and its VG's size."""
    argv = _argv("pvs", "--reportformat", "json", "--units", "b", "--nosuffix",
                 "-o", "pv_name,vg_name,pv_mda_size,pv_mda_free,vg_size")
    try:
        done = await run_lvm_process(argv, timeout=timeout)
    except CommandError as err:
        raise _classify(err, "listing PVs") from err
    rows = []
    for row in _report_rows(done.stdout, "pv"):
        try:
            rows.append(PvMetadata(
                pv=str(row["pv_name"]), vg=str(row.get("vg_name", "")),
                mda_size=int(row.get("pv_mda_size") or 0),
                mda_free=int(row.get("pv_mda_free") or 0),
                vg_size=int(row.get("vg_size") or 0)))
        except (KeyError, ValueError) as err:
            raise LvmError(f"listing PVs: unreadable report row {row!r}") from err
    return rows
