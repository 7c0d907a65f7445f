"""Proxmox size syntax and human-readable sizes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pvestord.policy.sizes import GiB, KiB, MiB, TiB, align_down, align_up, format_size, parse_size


@pytest.mark.parametrize(("text", "size"), [
    ("0", 0),
    ("4096", 4096),
    ("1K", KiB),
    ("512M", 512 * MiB),
    ("1G", GiB),
    ("2T", 2 * TiB),
    ("1.5G", 3 * GiB // 2),
    ("0.5M", MiB // 2),
    # Exact decimal arithmetic, truncated to bytes like Perl's int().
    ("1.1G", 1181116006),
    ("0.3K", 307),
])
def test_parse_size_accepts_proxmox_disk_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", [
    "", "G", "1g", "1GB", "1 G", " 1G", "1G ", "-1G", "1.G", ".5G", "1e3", "1P", "0x10",
    "1,5G", "1_000",
])
def test_parse_size_rejects_what_proxmox_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


@pytest.mark.parametrize(("size", "text"), [
    (0, "0 B"),
    (1023, "1023 B"),
    (KiB, "1 KiB"),
    (300 * MiB, "300 MiB"),
    (GiB, "1 GiB"),
    (3 * GiB // 2, "1.5 GiB"),
    (4 * GiB // 3, "~1.33 GiB"),
    (GiB + 1, "~1 GiB"),
    (GiB + 4 * MiB, "1028 MiB"),    # an LV at a 1 GiB qcow2's maximum
    (GiB + 512 * KiB, "1024.5 MiB"),
    (5 * TiB, "5 TiB"),
    (-2 * MiB, "-2 MiB"),
])
def test_format_size(size: int, text: str) -> None:
    assert format_size(size) == text


@given(st.integers(min_value=0, max_value=10**15), st.sampled_from(["", "K", "M", "G", "T"]))
def test_parse_size_round_trips_integers(number: int, unit: str) -> None:
    factor = {"": 1, "K": KiB, "M": MiB, "G": GiB, "T": TiB}[unit]
    assert parse_size(f"{number}{unit}") == number * factor


@given(st.integers(min_value=-(10**12), max_value=10**12),
       st.integers(min_value=1, max_value=10**9))
def test_alignment(size: int, alignment: int) -> None:
    up, down = align_up(size, alignment), align_down(size, alignment)
    assert up % alignment == 0 and down % alignment == 0
    assert down <= size <= up
    assert up - size < alignment and size - down < alignment


def test_alignment_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        align_up(1, 0)
