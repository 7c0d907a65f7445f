"""Fixtures for the node-guest tier: a fresh loop-device VG per test.

These tests only make sense inside the node guest (real device-mapper); run
them with ``make node``. Run on the host by mistake, they stop at once with a
clear message instead of failing one by one.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.faults import FaultLog, LvmFaults
from tests.harness.lvmbed import VG, loop_vg
from tests.proxmox import upstream


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--faults", choices=("quick", "full"), default="quick",
                     help="fault suite: the quick set (make check) or every kill moment "
                     "(make faults)")
    parser.addoption("--node-set", choices=("quick", "full"), default="quick",
                     help="the node tier's quick set (make check) or every test (make node "
                     "NODE=full)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "faults_full: a long fault test run by `make faults` (--faults=full) and "
        "left out of the quick set `make check` runs")
    config.addinivalue_line(
        "markers", "node_full: a long node test whose behaviour the quick set covers "
        "otherwise; run by `make node NODE=full`")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The quick set: `make check` must stay under an hour on 2 cores, and the
    longest fault tests (two to four minutes each under TCG) run in `make
    faults`, where every fault is tried."""
    skipped = set()
    if config.getoption("--faults") != "full":
        skipped.add("faults_full")
    if config.getoption("--node-set") != "full":
        skipped.add("node_full")
    quick = [item for item in items
             if not any(item.get_closest_marker(name) for name in skipped)]
    left_out = [item for item in items if item not in quick]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = quick


def pytest_sessionstart(session: pytest.Session) -> None:
    if not Path("/dev/mapper/control").exists():
        raise pytest.UsageError(
            "tests/integration/node needs device-mapper: run them in the node guest "
            "with `make node`")


@pytest.fixture
def faults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LvmFaults:
    """The ``lvm`` stand-in (tests/harness/lvm_faulty) for this test's daemons,
    through ``PVESTORD_LVM``: it fails, hangs or dawdles on request."""
    lvm_faults = LvmFaults(tmp_path / "lvm-faults")
    for name, value in lvm_faults.environment().items():
        monkeypatch.setenv(name, value)
    return lvm_faults


@pytest.fixture
def fault_log(tmp_path: Path) -> FaultLog:
    """Where a fault test records each fault it tried (``faults.jsonl``, which
    docs/reliability.md is generated from)."""
    return FaultLog(Path(os.environ.get("PVESTORD_TEST_OUT", str(tmp_path))))


@pytest.fixture
def full_node_set(request: pytest.FixtureRequest) -> bool:
    """True in ``make node NODE=full``: a test that repeats a step many times
    repeats it fewer times in the quick set."""
    return bool(request.config.getoption("--node-set") == "full")


@pytest.fixture
def vg() -> Iterator[VG]:
    with loop_vg() as volume_group:
        yield volume_group


@pytest.fixture
def out_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """Where a test leaves logs worth reading after a failure (the shared folder).

    Emptied first: the shared folder outlives a run, and a log appended to
    (Perl's, the daemons') must hold this run's lines alone, for the reader
    and for the tests that read them back."""
    base = Path(os.environ.get("PVESTORD_TEST_OUT", str(tmp_path)))
    path: Path = base / "tests" / request.node.name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> upstream.Upstream:
    """Proxmox's storage code unpacked (skips, naming what is missing, without it)."""
    reason = upstream.skip_reason()
    if reason is not None:
        pytest.skip(reason)
    return upstream.unpack(tmp_path_factory.mktemp("upstream"))
