"""Finding the Debian mirror the machine's apt uses, for debootstrap."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.debroot import debian_mirror


def test_one_line_sources(tmp_path: Path) -> None:
    (tmp_path / "sources.list").write_text(
        "# deb http://old.example/debian bookworm main\n"
        "deb http://security.debian.org/debian-security bookworm-security main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian bookworm main contrib\n")
    assert debian_mirror("bookworm", [tmp_path / "sources.list"]) == "http://mirror.example/debian"


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
    assert debian_mirror("bookworm", [tmp_path / "missing.list", d]) == "http://deb.example/debian"


def test_the_suites_own_source_first(tmp_path: Path) -> None:
    (tmp_path / "sources.list").write_text(
        "deb http://twelve.example/debian bookworm main\n"
        "deb http://thirteen.example/debian trixie main\n")
    assert debian_mirror("trixie", [tmp_path / "sources.list"]) == "http://thirteen.example/debian"
    assert debian_mirror("bookworm", [tmp_path / "sources.list"]) == "http://twelve.example/debian"


def test_another_releases_mirror_serves_this_one(tmp_path: Path) -> None:
    """A Debian 12 machine lists only bookworm: its mirror serves trixie too."""
    (tmp_path / "sources.list").write_text(
        "deb http://security.debian.org/debian-security bookworm-security main\n"
        "deb http://mirror.example/debian bookworm main\n")
    assert debian_mirror("trixie", [tmp_path / "sources.list"]) == "http://mirror.example/debian"


def test_no_debian_release_source_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "sources.list").write_text(
        "deb http://security.debian.org/debian-security bookworm-security main\n"
        "deb https://deb.nodesource.com/node_20.x nodistro main\n")
    with pytest.raises(RuntimeError, match="no apt source for Debian trixie"):
        debian_mirror("trixie", [tmp_path / "sources.list"])


@pytest.mark.parametrize("suite", ["bookworm", "trixie"])
def test_this_machine_has_one(suite: str) -> None:
    assert debian_mirror(suite).startswith(("http://", "https://"))
