"""How QEMU's block devices are matched to thin drives: exact names, no I/O."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class BlockDevice:
    """A device of ``query-block``, as far as pausing and resuming go."""

    #: The device's name (``device``, or its ``qdev`` path), for messages.
    name: str
    #: ``inserted.node-name``: the device's root node (PVE 9: a throttle filter
    #: above the format node; plain ``-blockdev``: the format node itself).
    block_node: str | None
    #: ``inserted.file``, and for a ``json:`` pseudo-filename every
    #: ``filename`` inside it: the paths the device's nodes sit on.
    filenames: frozenset[str]


def device_filenames(file: object) -> frozenset[str]:
    """The paths named by a node's ``file`` (``inserted.file``), exactly as written.

    A plain filename is itself. A ``json:{...}`` one (a node whose options do
    not fit a plain name) holds the path in a nested ``filename`` member.
    """
    if not isinstance(file, str) or not file:
        return frozenset()
    if not file.startswith("json:"):
        return frozenset({file})
    return frozenset(_filenames_in(_json_options(file)))


def own_filename(file: object) -> str | None:
    """The path a node's own ``file`` child sits on, from the node's ``file``.

    A plain filename is itself. A qcow2 node whose backing was set at run
    time (qemu-server's live snapshot adds the new top with ``backing: null``
    and then ``blockdev-snapshot``s it over the old one) gets a
    ``json:{"backing": {...}, "driver": "qcow2", "file": {"driver":
    "host_device", "filename": ...}}`` pseudo-filename: its own data is the
    top-level ``file`` member's ``filename``, never the backing's. A filter
    (qemu-server's throttle node, the source of its mirror) names the
    options of the node under it as its ``file``: its image is that node's.
    """
    if not isinstance(file, str) or not file:
        return None
    if not file.startswith("json:"):
        return file
    tree = _json_options(file)
    while isinstance(tree, dict) and isinstance(tree.get("file"), dict) \
            and isinstance(tree["file"].get("file"), dict):
        tree = tree["file"]
    child = tree.get("file") if isinstance(tree, dict) else None
    filename = child.get("filename") if isinstance(child, dict) else None
    return filename if isinstance(filename, str) and filename else None


def _json_options(file: str) -> object:
    """The options of a ``json:{...}`` pseudo-filename; None when they do not
    parse (a peer's junk must not stop a look)."""
    try:
        return json.loads(file[len("json:"):])
    except ValueError:
        return None


def _filenames_in(tree: object) -> Iterator[str]:
    if isinstance(tree, dict):
        for key, value in tree.items():
            if key == "filename" and isinstance(value, str):
                yield value
            else:
                yield from _filenames_in(value)
    elif isinstance(tree, list):
        for item in tree:
            yield from _filenames_in(item)


@dataclass(frozen=True)
class DriveIdentity:
    """How a thin drive is recognised in ``query-block``: its LV path and node-names."""

    path: str
    block_nodes: frozenset[str]


def device_on(device: BlockDevice, drive: DriveIdentity) -> bool:
    """Whether ``device`` sits on ``drive``: exact names only, never a substring
    (``/dev/san1/vm-101-disk-1`` is not ``/dev/san1/vm-101-disk-10``)."""
    return drive.path in device.filenames or (
        device.block_node is not None and device.block_node in drive.block_nodes)


#: ``werror`` values under which QEMU pauses the VM on ENOSPC, as thin
#: provisioning needs: ``auto`` is a device's default and means ``enospc``
#: for writes (the BlockBackend's own default). ``report`` and ``ignore``
#: hand the error to the guest, whose file system sees a failed write.
PAUSING_WERROR = frozenset({"auto", "enospc", "stop"})


def hands_enospc_to_guest(werror: str | None) -> bool:
    """Whether a device with this ``werror`` lets a full LV fail the guest's
    write instead of pausing it (None: unknown, assumed fine)."""
    return werror is not None and werror not in PAUSING_WERROR


def qom_path(device: BlockDevice) -> str:
    """The QOM path of a ``query-block`` device: its ``qdev`` is a path
    already (virtio-blk's backend) or the device's id (``scsi0``)."""
    return device.name if device.name.startswith("/") else f"/machine/peripheral/{device.name}"

