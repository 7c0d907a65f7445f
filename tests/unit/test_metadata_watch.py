"""LVM metadata room: the pure threshold and the once-per-crossing warning."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pvestord.engine.nodereport import MetadataWatch, StorageView, parse_report
from pvestord.policy.lvmetadata import (
    METADATA_LOW_SHARE,
    SEGMENT_BYTES,
    extensions_left,
    metadata_low,
)

KiB = 1024
MiB = 1024 * KiB
#: pvcreate's default on Debian 12 (data at 1 MiB): what vgs reported for a fresh VG.
DEFAULT_AREA = 1_044_480


@given(size=st.integers(1, 1 << 40), free=st.integers(0, 1 << 40))
def test_low_means_less_than_a_quarter_of_the_room(size: int, free: int) -> None:
    assert metadata_low(free, size) == (free < METADATA_LOW_SHARE * size / 2)


@given(size=st.integers(1, 1 << 40), free=st.integers(0, 1 << 40), less=st.integers(0, 1 << 40))
def test_less_room_is_never_better(size: int, free: int, less: int) -> None:
    if metadata_low(free, size):
        assert metadata_low(max(0, free - less), size)


@given(free=st.integers(-(1 << 20), 1 << 40))
def test_no_area_reported_is_never_low(free: int) -> None:
    assert not metadata_low(free, 0)


def test_figures_for_the_areas_in_the_docs() -> None:
    # Debian's default area: ~510 KiB of room, warned with ~1000 extensions left.
    room = DEFAULT_AREA // 2
    assert extensions_left(room) == 4080
    assert not metadata_low(int(room * 0.26), DEFAULT_AREA)
    assert metadata_low(int(room * 0.24), DEFAULT_AREA)
    assert extensions_left(int(room * 0.25)) == 1020
    # oVirt's 128 MiB: ~64 MiB of room, half a million extensions.
    assert extensions_left(64 * MiB) == 64 * MiB // SEGMENT_BYTES == 524288


def view(free: int, size: int = 32 * KiB, **kw: object) -> StorageView:
    return StorageView(vg="vgm", visible=True, mda_free=free, mda_size=size, **kw)  # type: ignore[arg-type]


def fielded(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str, str, str]]:
    return [(r.levelno, r.VG, r.MDA_FREE, r.MDA_SIZE)  # type: ignore[attr-defined]
            for r in caplog.records if hasattr(r, "MDA_FREE")]


def test_warns_once_per_crossing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pvestord.engine.nodereport")
    watch = MetadataWatch()
    for free in (13_000, 9_000, 4_100):           # above a quarter of 16 KiB: quiet
        watch.check(view(free))
    assert fielded(caplog) == []
    for free in (4_000, 3_000, 100):             # below: one warning, however far
        watch.check(view(free))
    assert fielded(caplog) == [(logging.WARNING, "vgm", "4000", "32768")]
    watch.check(view(12_000))                    # room again (LVs removed): said once
    watch.check(view(12_500))
    watch.check(view(2_000))                     # and the next crossing warns again
    assert fielded(caplog) == [(logging.WARNING, "vgm", "4000", "32768"),
                               (logging.INFO, "vgm", "12000", "32768"),
                               (logging.WARNING, "vgm", "2000", "32768")]


def test_unknown_or_unreadable_vgs_say_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pvestord.engine.nodereport")
    watch = MetadataWatch()
    watch.check(view(0, size=0))
    watch.check(StorageView(vg="vgm", visible=False, lvm_ok=False, error="gone"))
    watch.check(view(10, lvm_ok=False, error="vgs failed"))
    assert fielded(caplog) == []


def test_report_carries_the_metadata_room() -> None:
    text = ('{"format": 1, "node": "a", "time": 1.0, "interval": 10, "storages": {"s": '
            '{"vg": "v", "visible": true, "lvm_ok": true, "mda_free": 5, "mda_size": 64}}}')
    storage = parse_report(text, "test").storages["s"]
    assert (storage.mda_free, storage.mda_size) == (5, 64)
