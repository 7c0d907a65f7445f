"""Finding the Debian mirror the machine's apt uses, for debootstrap."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.packaging.debroot import debian_mirror


def test_one_line_sources(tmp_path: Path) -> None:
    (tmp_path / "sources.list").write_text(
        "# deb http://old.example/debian bookworm main\n"
        "deb http://security.debian.org/debian-security bookworm-security main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian bookworm main contrib\n")
    assert debian_mirror([tmp_path / "sources.list"]) == "http://mirror.example/debian"


def test_deb822_sources_skip_other_suites(tmp_path: Path) -> None:
    d = tmp_path / "sources.list.d"
    d.mkdir()
    (d / "a-security.sources").write_text(
        "Types: deb\nURIs: http://deb.debian.org/debian-security\n"
        "Suites: bookworm-security\nComponents: main\n")
    (d / "b-debian.sources").write_text(
        "Types: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\n\n"
        "Types: deb\nURIs: http://deb.example/debian http://second.example/debian\n"
        "Suites: bookworm bookworm-updates\nComponents: main\n")
    (d / "ignored.txt").write_text("deb http://not.read/debian bookworm main\n")
    assert debian_mirror([tmp_path / "missing.list", d]) == "http://deb.example/debian"


def test_no_bookworm_source_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "sources.list").write_text("deb http://deb.example/debian trixie main\n")
    with pytest.raises(RuntimeError, match="no apt source for Debian bookworm"):
        debian_mirror([tmp_path / "sources.list"])


def test_this_machine_has_one() -> None:
    assert debian_mirror().startswith(("http://", "https://"))
