"""Fixtures for the packaging tests: the built .deb and Debian 12 and 13 roots.

All are session-scoped: the package is built once (in a temporary copy of
the tree, by scripts/build-deb) and installed once into a copy of each
cached debootstrap root. Measured figures (build time, size, debootstrap and apt
times) are printed in the test summary (``-rA`` or the ``-s`` output).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pvestord.adapters.command import run
from tests.harness import debroot

SRC = Path(__file__).resolve().parents[2]
#: dpkg-buildpackage of a pure-Python package: seconds, allow for a slow box.
BUILD_TIMEOUT = 600.0


@dataclass
class Figures:
    """What `make packaging` measured, printed at the end of the session."""

    values: dict[str, str] = field(default_factory=dict)


_FIGURES = Figures()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _FIGURES.values:
        terminalreporter.section("packaging figures")
        for key, value in _FIGURES.values.items():
            terminalreporter.write_line(f"{key}: {value}")


@pytest.fixture(scope="session")
def figures() -> Figures:
    return _FIGURES


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("the packaging tests need root (debootstrap, chroot): "
                    "run `make packaging` as root")


def pyproject_version() -> str:
    m = re.search(r'^version\s*=\s*"([^"]+)"', (SRC / "pyproject.toml").read_text(), re.MULTILINE)
    assert m, "pyproject.toml has no version"
    return m.group(1)


@pytest.fixture(scope="session")
def deb(tmp_path_factory: pytest.TempPathFactory, figures: Figures) -> Path:
    """pvestord_<version>_all.deb, built from a copy of the source tree."""
    out = tmp_path_factory.mktemp("deb")
    start = time.monotonic()
    run([str(SRC / "scripts/build-deb"), str(out)], timeout=BUILD_TIMEOUT)
    figures.values["build time (scripts/build-deb)"] = f"{time.monotonic() - start:.1f} s"
    debs = sorted(out.glob("pvestord_*_all.deb"))
    assert len(debs) == 1, f"expected one .deb in {out}, found {debs}"
    figures.values["package size"] = f"{debs[0].stat().st_size} bytes ({debs[0].name})"
    return debs[0]


@pytest.fixture(scope="session", params=list(debroot.RELEASES))
def installed_root(request: pytest.FixtureRequest, deb: Path,
                   tmp_path_factory: pytest.TempPathFactory,
                   figures: Figures) -> Iterator[Path]:
    """A copy of the clean Debian 12 (``bookworm``) or 13 (``trixie``) root with
    the package installed by apt: every test that uses it runs in both, one
    root per release for the whole session (``trixie`` alone, for a test
    marked ``@pytest.mark.parametrize("installed_root", ["trixie"], indirect=True)``).
    """
    needs_root()
    release = debroot.RELEASES[request.param]
    base, took = debroot.base_root(release)
    figures.values[f"debootstrap ({release.suite})"] = (
        "cached" if took is None else f"{took:.0f} s")
    root = debroot.copy_root(base, tmp_path_factory.mktemp(f"debroot-{release.suite}") / "root")
    try:
        # systemd as on every Proxmox node: the units are verified there.
        seconds = debroot.install_deb(root, release, deb, extra=["systemd"])
        figures.values[f"apt install into the {release.suite} root"] = f"{seconds:.0f} s"
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
