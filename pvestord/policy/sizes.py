"""Byte sizes: Proxmox's size syntax in, human-readable sizes out, alignment.

Sizes in ``storage.cfg`` use Proxmox's ``disk-size`` format
(``PVE::JSONSchema::parse_size``): a decimal number with an optional
fraction and an optional *upper-case* binary suffix ``K``, ``M``, ``G`` or
``T`` (powers of 1024); no suffix means bytes; the result is truncated to
whole bytes. We accept exactly that, so a value pvestord takes is a value
Proxmox takes, and the other way round: ``1g``, ``1GB`` or ``1 G`` are
rejected by both. Fractions are computed exactly (``1.1G`` is not subject to
binary floating point rounding).
"""

from __future__ import annotations

import re
from fractions import Fraction

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
TiB = 1024 * GiB

_UNITS = {"": 1, "K": KiB, "M": MiB, "G": GiB, "T": TiB}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)([KMGT]?)")


def parse_size(text: str) -> int:
    """Bytes for a Proxmox size (``2G``, ``512M``, ``1.5G``, ``4096``).

    :raises ValueError: ``text`` is not in Proxmox's ``disk-size`` format
        (argparse turns that into a usage error when used as ``type=``).
    """
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ValueError(
            f"not a size: {text!r} (expected a number with an optional K, M, G or T"
            " suffix, e.g. 512M or 1.5G)")
    number, unit = match.groups()
    return int(Fraction(number) * _UNITS[unit])


def format_size(size: int) -> str:
    """``size`` for people: ``1 GiB``, ``1.5 GiB``, ``300 MiB``, ``1028 MiB``.

    The largest unit that shows the size exactly with at most two decimals
    wins, so an LV at a qcow2's maximum (a whole number of extents just past
    a round size) reads ``1028 MiB``, not ``~1 GiB``. A size no unit shows
    exactly gets the largest unit, up to two decimals and a ``~``
    (``~1.33 GiB``): a log line never claims an exactness it does not have.
    """
    sign = "-" if size < 0 else ""
    value = abs(size)
    approximate: str | None = None
    for unit, name in ((TiB, "TiB"), (GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if value < unit:
            continue
        shown = f"{value / unit:.2f}".rstrip("0").rstrip(".")
        if Fraction(shown) * unit == value:
            return f"{sign}{shown} {name}"
        if approximate is None:
            approximate = f"{sign}~{shown} {name}"
    return approximate if approximate is not None else f"{sign}{value} B"


def align_up(size: int, alignment: int) -> int:
    """The smallest multiple of ``alignment`` that is >= ``size``."""
    if alignment <= 0:
        raise ValueError(f"alignment must be positive, got {alignment}")
    return -(-size // alignment) * alignment


def align_down(size: int, alignment: int) -> int:
    """The largest multiple of ``alignment`` that is <= ``size``."""
    if alignment <= 0:
        raise ValueError(f"alignment must be positive, got {alignment}")
    return size // alignment * alignment
