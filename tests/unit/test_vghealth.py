"""VG health marks: kept in files, refused changes name the mark and how to clear it."""

from __future__ import annotations

from pathlib import Path

import pytest

from pvestord.adapters.vghealth import VgMarks, VgUnhealthyError
from pvestord.errors import PvestordError


def test_a_healthy_vg_passes_the_check(tmp_path: Path) -> None:
    health = VgMarks(tmp_path / "marks")
    health.check("san1")
    assert health.get("san1") is None
    assert health.marked() == {}


def test_a_marked_vg_is_refused_until_the_file_is_removed(tmp_path: Path) -> None:
    health = VgMarks(tmp_path / "marks")
    health.mark("san1", "lvextend could not be killed\nafter 30 s")
    with pytest.raises(VgUnhealthyError) as refused:
        health.check("san1")
    message = str(refused.value)
    assert "lvextend could not be killed after 30 s" in message
    assert str(tmp_path / "marks" / "san1") in message
    assert set(VgMarks(tmp_path / "marks").marked()) == {"san1"}  # another process sees it
    (tmp_path / "marks" / "san1").unlink()
    health.check("san1")


def test_a_hostile_vg_name_never_becomes_a_path(tmp_path: Path) -> None:
    health = VgMarks(tmp_path / "marks")
    for name in ("../etc", "a/b", "", ".", "..", "-x"):
        with pytest.raises(PvestordError):
            health.mark(name, "x")
    assert not (tmp_path / "etc").exists()
