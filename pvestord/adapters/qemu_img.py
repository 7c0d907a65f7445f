"""``qemu-img info``, ``measure``, ``check`` and ``map``, and the maximum LV size of an image.

Each call runs the binary from :func:`pvestord.adapters.command.binary` (``PVESTORD_QEMU_IMG``
overrides it) with ``--output=json`` and returns a typed result. Failures are
:class:`~pvestord.errors.CommandError` (the command, exit status, stderr) or
:class:`QemuImgError` (output we cannot read). ``qemu-img check`` finding
leaks or corruption is a result, not an error: the caller decides.

Every call takes a ``timeout`` with a documented default (the named
constants below) and passes it to :func:`pvestord.adapters.command.run_async`, which
kills the whole process group when it runs out: a plain ``asyncio.timeout``
around the call would do the same, but every caller would then have to know
the budget.

Images in use by a running QEMU hold its image locks; ``force_share`` passes
``-U`` so metadata can be read anyway. ``check`` takes it only for an image
whose QEMU is paused and flushed (a running VM's copy target being reduced,
:mod:`pvestord.engine.livereduce`): on an image being written its answer is
meaningless.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pvestord.adapters import command
from pvestord.errors import CommandError, PvestordError
from pvestord.policy.blockjobs import Extent
from pvestord.policy.sizes import align_up

#: ``info`` reads the header only (backing files are not opened).
INFO_TIMEOUT = 30.0
#: ``measure --size`` does arithmetic only; it opens no image.
MEASURE_TIMEOUT = 30.0
#: ``check`` reads every metadata table: minutes on a multi-TiB image.
CHECK_TIMEOUT = 600.0

#: ``map`` reads every L2 table of the chain: under a second for a 200 GiB
#: image with metadata preallocated, as Proxmox makes them.
MAP_TIMEOUT = 30.0

#: qcow2's default cluster size, used when ``info`` does not say.
DEFAULT_CLUSTER_SIZE = 65536
#: Size of a qcow2 bitmap directory entry without its name (Qcow2BitmapDirEntry).
_BITMAP_DIR_ENTRY = 24


class QemuImgError(PvestordError):
    """``qemu-img`` ran but said something we cannot use."""


@dataclass(frozen=True)
class Bitmap:
    """A persistent dirty bitmap stored in a qcow2 image."""

    name: str
    granularity: int
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class ImageInfo:
    """What ``qemu-img info`` says about one image (not its backing chain)."""

    filename: str
    format: str
    virtual_size: int
    #: Bytes the image uses on its storage (for a block device, its size).
    actual_size: int | None
    #: None for formats without clusters (raw).
    cluster_size: int | None
    extended_l2: bool
    refcount_bits: int | None
    bitmaps: tuple[Bitmap, ...]
    backing_filename: str | None
    backing_format: str | None
    dirty: bool
    corrupt: bool


@dataclass(frozen=True)
class Measure:
    """``qemu-img measure``: bytes an image needs, as it is and fully allocated."""

    required: int
    fully_allocated: int
    #: Bytes for the source's persistent bitmaps; only when measuring an image.
    bitmaps: int | None = None


class CheckStatus(enum.Enum):
    CLEAN = "clean"
    #: Exit status 3: leaked clusters only; harmless wasted space.
    LEAKS = "leaks"
    #: Exit status 2: the image is corrupted.
    CORRUPT = "corrupt"


@dataclass(frozen=True)
class CheckResult:
    status: CheckStatus
    #: Where the image's data ends: how much of the LV it really uses.
    image_end_offset: int | None
    total_clusters: int | None
    allocated_clusters: int | None
    fragmented_clusters: int | None
    leaks: int
    corruptions: int
    check_errors: int
    #: qemu-img's human-readable findings (its stderr), for the log.
    messages: str


async def info(path: Path | str, *, image_format: str | None = "qcow2",
               force_share: bool = False, timeout: float = INFO_TIMEOUT) -> ImageInfo:  # noqa: ASYNC109
    """``qemu-img info`` of ``path``.

    ``image_format`` is passed with ``-f`` so nothing is probed (probing a raw
    image a guest wrote to is unsafe); None lets qemu-img probe.

    :raises CommandError: qemu-img failed or overran ``timeout``.
    :raises QemuImgError: its output is not what QEMU documents.
    """
    argv = [command.binary("qemu-img"), "info", "--output=json"]
    if image_format is not None:
        argv += ["-f", image_format]
    if force_share:
        argv.append("-U")
    argv.append(str(path))
    done = await command.run_async(argv, timeout=timeout)
    return parse_info(_json(done.stdout, argv))


async def measure(virtual_size: int, *, cluster_size: int | None = None,
                  extended_l2: bool = False, refcount_bits: int | None = None,
                  timeout: float = MEASURE_TIMEOUT) -> Measure:  # noqa: ASYNC109
    """``qemu-img measure --size`` for a qcow2 image of ``virtual_size``.

    No image is opened, so this works for an image in use and never reads
    guest data. Bitmaps are not included (see :func:`bitmaps_size`).

    :raises CommandError: qemu-img failed or overran ``timeout``.
    :raises QemuImgError: its output is not what QEMU documents.
    """
    options = []
    if cluster_size is not None:
        options.append(f"cluster_size={cluster_size}")
    if extended_l2:
        options.append("extended_l2=on")
    if refcount_bits is not None:
        options.append(f"refcount_bits={refcount_bits}")
    argv = [command.binary("qemu-img"), "measure", "--output=json",
            "--size", str(virtual_size), "-O", "qcow2"]
    if options:
        argv += ["-o", ",".join(options)]
    done = await command.run_async(argv, timeout=timeout)
    return parse_measure(_json(done.stdout, argv))


async def check(path: Path | str, *, image_format: str = "qcow2", force_share: bool = False,
                timeout: float = CHECK_TIMEOUT) -> CheckResult:  # noqa: ASYNC109
    """``qemu-img check`` of ``path`` (read-only: it repairs nothing);
    ``force_share``: past a paused QEMU's image lock (``-U``).

    :raises CommandError: the check could not be completed (exit status 1),
        the format cannot be checked (63), or qemu-img overran ``timeout``.
    :raises QemuImgError: its output is not what QEMU documents.
    """
    argv = [command.binary("qemu-img"), "check", "--output=json", "-f", image_format,
            *(["-U"] if force_share else []), str(path)]
    done = await command.run_async(argv, timeout=timeout, check=False)
    statuses = {0: CheckStatus.CLEAN, 2: CheckStatus.CORRUPT, 3: CheckStatus.LEAKS}
    if done.returncode not in statuses:
        raise CommandError(argv, done.returncode, done.stderr)
    return parse_check(_json(done.stdout, argv), statuses[done.returncode], done.stderr)


async def allocation_map(path: Path | str, *, unlocked_backings: int = 0,
                         image_format: str = "qcow2",
                         timeout: float = MAP_TIMEOUT) -> list[Extent]:  # noqa: ASYNC109
    """``qemu-img map`` of ``path`` and its backing chain: which layer holds
    each range of the virtual disk (:class:`~pvestord.policy.Extent`).

    The chain is one a running QEMU has open, and a ``block-commit`` takes
    its intermediate layers without sharing "consistent read", so QEMU's
    image lock refuses even ``-U`` on them. The image and its first
    ``unlocked_backings`` backing layers are therefore opened with
    ``locking=off``, the layers below with ``-U``: the map is read for an
    estimate (the room a block job needs), which an image being written
    cannot spoil beyond the clusters in flight. Each file keeps its plain
    name, so relative backing file names (Proxmox's) resolve.

    :raises CommandError: qemu-img failed or overran ``timeout``.
    :raises QemuImgError: its output is not what QEMU documents.
    """
    # No protocol driver named: QEMU picks host_device for a block device
    # (an LV) and file for a regular file, as for a plain filename. A
    # backing's options without a filename complete the one its overlay names.
    unlocked = {"file": {"locking": "off"}}
    spec: dict[str, Any] = {"driver": image_format,
                            "file": {"filename": str(path), "locking": "off"}}
    layer = spec
    for _ in range(unlocked_backings):
        layer["backing"] = dict(unlocked)
        layer = layer["backing"]
    argv = [command.binary("qemu-img"), "map", "--output=json", "-U",
            "json:" + json.dumps(spec)]
    done = await command.run_async(argv, timeout=timeout)
    try:
        return parse_map(json.loads(done.stdout))
    except (ValueError, TypeError, KeyError) as err:
        raise QemuImgError(f"{' '.join(argv)}: unreadable map: {err}") from err


async def maximum_required(info: ImageInfo, *, timeout: float = MEASURE_TIMEOUT) -> int:  # noqa: ASYNC109
    """The most bytes ``info``'s image can ever occupy: measure plus bitmaps.

    :raises CommandError, QemuImgError: as :func:`measure`.
    """
    measured = await measure(info.virtual_size, cluster_size=info.cluster_size,
                             extended_l2=info.extended_l2,
                             refcount_bits=info.refcount_bits, timeout=timeout)
    return required_size(info, measured)


# --- pure parts ----------------------------------------------------------------

def required_size(info: ImageInfo, measured: Measure) -> int:
    """The fully allocated size of ``info``'s image: ``measured`` plus bitmaps.

    ``measured`` is ``measure --size`` for the image's own virtual size and
    cluster layout (:func:`maximum_required` runs it). Feed the result to
    :func:`pvestord.policy.maximum_size` for the extent-aligned maximum.
    """
    cluster = info.cluster_size or DEFAULT_CLUSTER_SIZE
    extra = measured.bitmaps
    if extra is None:
        extra = bitmaps_size(info.virtual_size, cluster, info.bitmaps)
    return measured.fully_allocated + extra


def bitmaps_size(virtual_size: int, cluster_size: int, bitmaps: Iterable[Bitmap]) -> int:
    """Bytes the persistent ``bitmaps`` take in a qcow2 image, fully allocated.

    The same arithmetic as QEMU's ``qcow2_measure_bitmaps`` (what ``qemu-img
    measure`` reports as ``bitmaps`` for an image): per bitmap, its data in
    whole clusters plus its table (8 bytes a data cluster) in whole clusters;
    plus the directory (24 bytes and the name per bitmap, 8-byte aligned) in
    whole clusters. ``measure --size`` cannot know the bitmaps, hence this.
    Bitmaps known only to a running QEMU (``query-block`` ``dirty-bitmaps``
    with ``persistent``) count too: they are written when it closes the image.
    """
    total = 0
    directory = 0
    for bitmap in bitmaps:
        data_bytes = _ceil_div(_ceil_div(virtual_size, bitmap.granularity), 8)
        clusters = _ceil_div(data_bytes, cluster_size)
        total += clusters * cluster_size
        total += align_up(clusters * 8, cluster_size)
        directory += align_up(_BITMAP_DIR_ENTRY + len(bitmap.name.encode()), 8)
    return total + align_up(directory, cluster_size)


def parse_info(data: Mapping[str, Any]) -> ImageInfo:
    """An :class:`ImageInfo` from ``qemu-img info --output=json``'s object.

    :raises QemuImgError: a documented field is missing, has the wrong type,
        or a size the maximum cannot be computed from.
    """
    try:
        specific = data.get("format-specific", {}).get("data", {})
        bitmaps = tuple(
            Bitmap(str(b["name"]), int(b["granularity"]), tuple(b.get("flags", ())))
            for b in specific.get("bitmaps", ()))
        info = ImageInfo(
            filename=str(data["filename"]),
            format=str(data["format"]),
            virtual_size=int(data["virtual-size"]),
            actual_size=_optional_int(data, "actual-size"),
            cluster_size=_optional_int(data, "cluster-size"),
            extended_l2=bool(specific.get("extended-l2", False)),
            refcount_bits=_optional_int(specific, "refcount-bits"),
            bitmaps=bitmaps,
            backing_filename=data.get("backing-filename"),
            backing_format=data.get("backing-filename-format"),
            dirty=bool(data.get("dirty-flag", False)),
            corrupt=bool(specific.get("corrupt", False)),
        )
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as err:
        raise QemuImgError(f"unexpected qemu-img info output ({err!r}): {data}") from err
    # The maximum's arithmetic divides by these (bitmaps_size, align_up).
    if (info.virtual_size < 0 or (info.cluster_size is not None and info.cluster_size <= 0)
            or any(b.granularity <= 0 for b in info.bitmaps)):
        raise QemuImgError(f"unexpected qemu-img info output (a negative size, or a cluster"
                           f" size or bitmap granularity that is not positive): {data}")
    return info


def parse_map(data: object) -> list[Extent]:
    """The ranges of a ``qemu-img map --output=json`` reply.

    :raises TypeError, KeyError: an entry lacks a field or has the wrong type.
    """
    if not isinstance(data, list):
        raise TypeError(f"a list of ranges expected, not {type(data).__name__}")
    extents = []
    for entry in data:
        start, length, depth, has_data = (entry["start"], entry["length"], entry["depth"],
                                          entry["data"])
        if not (all(isinstance(n, int) and not isinstance(n, bool)
                    for n in (start, length, depth)) and isinstance(has_data, bool)):
            raise TypeError(f"a range with a field of the wrong type: {entry!r}")
        extents.append(Extent(start, length, depth, has_data))
    return extents


def parse_measure(data: Mapping[str, Any]) -> Measure:
    """A :class:`Measure` from ``qemu-img measure --output=json``'s object.

    :raises QemuImgError: a documented field is missing or has the wrong type.
    """
    try:
        return Measure(int(data["required"]), int(data["fully-allocated"]),
                       _optional_int(data, "bitmaps"))
    except (KeyError, TypeError, ValueError, OverflowError) as err:
        raise QemuImgError(f"unexpected qemu-img measure output ({err!r}): {data}") from err


def parse_check(data: Mapping[str, Any], status: CheckStatus, messages: str = "") -> CheckResult:
    """A :class:`CheckResult` from ``qemu-img check --output=json``'s object.

    QEMU leaves ``leaks`` and ``corruptions`` out when they are zero.

    :raises QemuImgError: a field has the wrong type.
    """
    try:
        return CheckResult(
            status=status,
            image_end_offset=_optional_int(data, "image-end-offset"),
            total_clusters=_optional_int(data, "total-clusters"),
            allocated_clusters=_optional_int(data, "allocated-clusters"),
            fragmented_clusters=_optional_int(data, "fragmented-clusters"),
            leaks=int(data.get("leaks", 0)),
            corruptions=int(data.get("corruptions", 0)),
            check_errors=int(data.get("check-errors", 0)),
            messages=messages.strip(),
        )
    except (TypeError, ValueError, AttributeError, OverflowError) as err:
        raise QemuImgError(f"unexpected qemu-img check output ({err!r}): {data}") from err


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _optional_int(data: Mapping[str, Any], key: str) -> int | None:
    value = data.get(key)
    return None if value is None else int(value)


def _json(text: str, argv: list[str]) -> Mapping[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise QemuImgError(f"{' '.join(argv)}: output is not JSON: {text[:200]!r}") from err
    if not isinstance(data, dict):
        raise QemuImgError(f"{' '.join(argv)}: output is not a JSON object: {text[:200]!r}")
    return data
