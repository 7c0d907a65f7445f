"""``pvestord volume create|shrink|reduce-copy|list|record-maxima``: thin volumes for Proxmox.

The work is :mod:`pvestord.features.volumes`'s; this is its command line.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
from pathlib import Path

from pvestord import paths
from pvestord.cli import options
from pvestord.features import volumes
from pvestord.policy.sizes import format_size, parse_size
from pvestord.policy.volumes import (
    VolumeError,
    check_vmid,
    parse_chain_volume_id,
    parse_volume_id,
)

#: A Proxmox size such as 32G; a bad suffix is a usage error (exit 2).
_SIZE = options.argument_type(parse_size)


def _vmid(text: str) -> int:
    try:
        return check_vmid(int(text, 10))
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not a VMID: {text!r}") from err
    except VolumeError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--storage-config", type=Path, default=paths.STORAGE_CFG,
                        metavar="PATH", help="storage.cfg to read (default: %(default)s)")
    parser.add_argument("--lock-dir", type=Path, default=None, metavar="DIR",
                        help="force pmxcfs-style lock directories in DIR (default: as "
                        "Proxmox: /etc/pve/priv/lock for shared storage, else flock)")
    options.add_lock_options(parser)


def _settings(args: argparse.Namespace) -> volumes.VolumeSettings:
    return volumes.VolumeSettings(
        storage_config=args.storage_config, lock_dir=args.lock_dir,
        lock_lifetime=args.lock_lifetime, vg_health_dir=args.vg_health_dir,
        run_dir=getattr(args, "run_dir", paths.QEMU_SERVER_RUN),
        cluster_dir=getattr(args, "cluster_dir", volumes.CLUSTER_DIR))


def register(sub: options.SubCommands) -> None:
    volume = sub.add_parser(
        "volume", help="create thin qcow2 volumes, shrink stopped ones, list them",
        description="Thin qcow2 volumes on thin-enabled LVM storages, named and tagged as "
        "Proxmox's LVM plugin does, so Proxmox can attach them.")
    vsub = volume.add_subparsers(dest="volume_command", metavar="ACTION", required=True)

    create = options.add_command(vsub, "create", _create,
                                 "create a thin qcow2 volume at the storage's initial-size")
    _common(create)
    create.add_argument("storage", metavar="STORAGE", help="a thin-enabled lvm storage")
    create.add_argument("vmid", type=_vmid, metavar="VMID")
    create.add_argument("size", type=_SIZE, metavar="SIZE",
                        help="the disk's virtual size, e.g. 32G (K, M, G, T suffixes)")
    create.add_argument("--name", default=None, metavar="NAME",
                        help="volume name instead of the next free vm-VMID-disk-N.qcow2")

    shrink = options.add_command(vsub, "shrink", _shrink,
                                 "reduce a stopped volume's LVs (its snapshots' too) to "
                                 "their data plus a chunk")
    _common(shrink)
    shrink.add_argument("volid", metavar="STORAGE:VOLNAME")
    shrink.add_argument("--dry-run", action="store_true",
                        help="say what would be done; change nothing")
    shrink.add_argument("--run-dir", type=Path, default=paths.QEMU_SERVER_RUN,
                        metavar="DIR", help="where QEMU's <vmid>.pid lives "
                        "(default: %(default)s)")
    shrink.add_argument("--cluster-dir", type=Path, default=volumes.CLUSTER_DIR,
                        metavar="DIR", help="the cluster folder: shrink needs its "
                        ".members to show quorum and its .vmlist to place the VM on this "
                        "node; its .rrd can only refuse (default: %(default)s)")
    options.add_json_option(shrink)

    reduce = options.add_command(
        vsub, "reduce-copy", _reduce_copy,
        "reduce a copy target's LV once its copy is over (run by the Proxmox plugin)")
    _common(reduce)
    reduce.add_argument("volid", metavar="STORAGE:VOLNAME")
    reduce.add_argument("--on-activation", action="store_true",
                        help="Proxmox has just activated it: reduce only when the image "
                        "holds data (else: Proxmox is about to deactivate it)")
    reduce.add_argument("--run-dir", type=Path, default=paths.QEMU_SERVER_RUN,
                        metavar="DIR", help="where QEMU's <vmid>.pid lives "
                        "(default: %(default)s)")
    reduce.add_argument("--cluster-dir", type=Path, default=volumes.CLUSTER_DIR,
                        metavar="DIR", help="the cluster folder: a .vmlist placing the VM "
                        "on another node refuses (default: %(default)s)")
    options.add_json_option(reduce)

    record = options.add_command(
        vsub, "record-maxima", _record_maxima,
        "record in an LV tag the maximum of thin LVs made before it was recorded")
    _common(record)
    record.add_argument("storage", metavar="STORAGE", help="a thin-enabled lvm storage")
    options.add_json_option(record)

    listing = options.add_command(
        vsub, "list", _list, "the thin storages' qcow2 volumes and what shrink would give back")
    _common(listing)
    options.add_json_option(listing)


def _create(args: argparse.Namespace) -> int:
    """Under the storage lock, create the LV vm-VMID-disk-N.qcow2 (first free
    N) at the storage's initial-size (never more than the image can need), tagged
    pve-vm-VMID, and format it as qcow2 of virtual size SIZE without preallocation.
    Prints the volume id."""
    created = asyncio.run(volumes.create(_settings(args), args.storage, args.vmid, args.size,
                                         args.name))
    print(created.volid)
    return 0


def _shrink(args: argparse.Namespace) -> int:
    """For a volume whose VM runs nowhere and whose LVs are not active on this
    node (the VM's config on this node per the cluster's VM list, with quorum, and no
    QEMU of it here): check the image of every LV of its chain (the disk and the
    snapshot LVs it is backed by), then reduce each LV to max(initial-size, image
    end + one chunk) in whole extents. Refuses, saying which LV and why, when that
    is not safe for any of them; then none is changed. One line per LV, the top first."""
    volid = parse_volume_id(args.volid)
    result = asyncio.run(volumes.shrink(_settings(args), volid, dry_run=args.dry_run))
    if args.json:
        print(json.dumps({**dataclasses.asdict(result), "volid": str(result.volid),
                          "reclaimed": result.reclaimed}, indent=2))
        return 0
    for lv in result.chain:
        name = f"{volid.storeid}:{lv.lv}"
        sizes = (f"{format_size(lv.lv_size_before)} -> {format_size(lv.target)} (image end "
                 f"{format_size(lv.image_end)}, ")
        if lv.target >= lv.lv_size_before:
            print(f"{name}: nothing to shrink: LV {format_size(lv.lv_size_before)}, image "
                  f"end {format_size(lv.image_end)}")
        elif result.dry_run:
            print(f"{name}: would shrink LV {sizes}gives back {format_size(lv.reclaimed)})")
        else:
            print(f"{name}: shrank LV {sizes}gave back {format_size(lv.reclaimed)})")
    if result.dry_run:
        print(f"{volid}: dry run, nothing changed")
    elif result.reclaimed:
        print(f"{volid}: {len(result.chain)} LV(s), gave back "
              f"{format_size(result.reclaimed)} in {result.seconds:.1f} s")
    return 0


def _reduce_copy(args: argparse.Namespace) -> int:
    """For a volume (or a snapshot LV of one) tagged pvestord-copy (grown for a copy
    or a snapshot delete's merge into it), active
    and not open on this node, its VM not running here and its config on no other node
    (a live migration's source leaves it to the target): once the copy is over
    (always before a deactivation; after an activation only when the image holds
    data), check the image, then under the storage lock reduce the LV to
    max(initial-size, image end + one chunk) in whole extents and drop the tag.
    Any other volume is left alone. Refuses, saying why, when that is not safe."""
    volid = parse_chain_volume_id(args.volid)
    result = asyncio.run(volumes.reduce_copy_target(_settings(args), volid,
                                                    on_activation=args.on_activation))
    if args.json:
        print(json.dumps({**dataclasses.asdict(result), "volid": str(result.volid)}, indent=2))
    elif result.done:
        print(f"{volid}: copy over, LV {format_size(result.lv_size_before)} -> "
              f"{format_size(result.lv_size_after)} (image end "
              f"{format_size(result.image_end or 0)})")
    else:
        print(f"{volid}: nothing done: {result.note}")
    return 0


def _record_maxima(args: argparse.Namespace) -> int:
    """Add the pvestord-max-<bytes> tag every node's capacity figures read to
    the storage's thin LVs without it: qcow2 LVs active here are measured
    (outside the lock), raw ones take their LV size; qcow2 LVs not active here
    are named, for a run on their node. Exits 1 while some are left."""
    result = asyncio.run(volumes.record_maxima(_settings(args), args.storage))
    if args.json:
        print(json.dumps(dataclasses.asdict(result), indent=2))
    else:
        for lv, maximum in sorted(result.recorded.items()):
            print(f"{args.storage}:{lv}: recorded maximum {format_size(maximum)}")
        for lv in result.inactive:
            print(f"{args.storage}:{lv}: not active on this node: run this where it is")
        for lv, why in sorted(result.failed.items()):
            print(f"{args.storage}:{lv}: not measured: {why}")
    return 1 if result.inactive or result.failed else 0


def _list(args: argparse.Namespace) -> int:
    """Every qcow2 LV of every thin-enabled storage: LV size, image end,
    virtual size, maximum, and the space 'shrink' would reclaim. Image figures need
    the LV active here; inactive LVs are not activated."""
    reports = asyncio.run(volumes.list_volumes(_settings(args)))
    if args.json:
        print(json.dumps([{**dataclasses.asdict(r), "snapshot": r.snapshot} for r in reports],
                         indent=2))
        return 0

    def size(value: int | None) -> str:
        return "-" if value is None else format_size(value)

    header = ("VOLUME", "STATE", "LV SIZE", "IMAGE END", "VIRTUAL", "MAXIMUM", "RECLAIMABLE")
    rows = [(r.volid, r.state, size(r.lv_size), size(r.image_end), size(r.virtual_size),
             size(r.maximum), size(r.reclaimable)) for r in reports]
    widths = [max(len(c) for c in col) for col in zip(header, *rows, strict=True)]
    for row in (header, *rows):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    if not rows:
        print("(no qcow2 volumes on thin storages)")
    for report in reports:
        if report.error:
            print(f"pvestord: {report.volid}: {report.error}")
    return 0


__all__ = ["register"]
