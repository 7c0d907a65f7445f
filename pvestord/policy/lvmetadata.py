"""How much LVM metadata thin LVs use: the arithmetic of a VG's metadata room.

Pure, and here rather than in the node report, because two callers judge the
same figures: the running daemon (:mod:`pvestord.engine.nodereport`, which
warns when the room runs low) and ``pvestord check`` (which compares a VG's
metadata area with the extensions its thin storages can make, before they
are made). docs/operations.md, "LVM metadata", has the measurements.
"""

from __future__ import annotations

#: Bytes of VG metadata one more LV segment takes: LVM's on-disk text for a
#: linear segment is ~100 bytes (measured: 2048 bytes of ``vg_mda_free`` per 20
#: interleaved one-extent extensions, LVM 2.03.16), rounded up for longer
#: numbers. Each chunk extension of an LV whose neighbour grew in between is
#: a new segment.
SEGMENT_BYTES = 128
#: Warn when less than this share of the metadata room is left. The room is
#: half the area (LVM keeps the old copy while writing the new one), so with
#: Debian's default area (~1 MiB, ~510 KiB of room, ~5000 segments) the
#: warning comes ~1000 extensions before every lvextend in the VG fails.
METADATA_LOW_SHARE = 0.25


def room(mda_size: int) -> int:
    """What of a metadata area of ``mda_size`` bytes the VG's text may fill:
    half, as LVM writes each new version beside the old one."""
    return max(0, mda_size) // 2


def metadata_low(mda_free: int, mda_size: int) -> bool:
    """True when a VG's metadata has less than :data:`METADATA_LOW_SHARE` of its
    room left (room = half the metadata area, what ``vg_mda_free`` counts down
    from). False when LVM reported no area (``mda_size`` 0: unknown)."""
    if mda_size <= 0:
        return False
    return mda_free < METADATA_LOW_SHARE * (mda_size / 2)


def extensions_left(mda_free: int) -> int:
    """About how many more one-segment extensions the VG's metadata takes."""
    return max(0, mda_free) // SEGMENT_BYTES


def segments_possible(vg_size: int, chunksize: int) -> int:
    """The most segments chunk extensions can cut a VG of ``vg_size`` bytes
    into: every chunk of it a segment of its own (the worst case on a busy
    shared VG, where a neighbour grows between any two extensions of an LV)."""
    if vg_size <= 0 or chunksize <= 0:
        return 0
    return -(-vg_size // chunksize)


def segments_room(mda_size: int) -> int:
    """About how many segments an area of ``mda_size`` bytes holds in all."""
    return room(mda_size) // SEGMENT_BYTES
