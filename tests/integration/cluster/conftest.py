"""The two-node tier: two node guests on one SAN, driven from the host.

The pair boots once per session (``make cluster``), and both nodes' daemons
run for the whole session against the shared ``pve`` folder; consoles and
every daemon's and QEMU's log stay in ``out/cluster`` for reading after a
failure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.migrationguest import CHUNK, INITIAL, Guest, threshold
from tests.harness.polling import wait_until
from tests.harness.twonode import REPO, Cluster, attach, cluster_pair, storage_section


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cluster", choices=("quick", "full"), default="quick",
                     help="quick: one variant of each scenario (make check); full: every "
                     "variant (make cluster CLUSTER=full)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cluster_full: a further variant of a scenario the "
                            "quick set already runs; only --cluster=full runs it")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--cluster") == "full":
        return
    later = [item for item in items if item.get_closest_marker("cluster_full")]
    if later:
        config.hook.pytest_deselected(items=later)
        items[:] = [item for item in items if item not in later]


@pytest.fixture(scope="session")
def full(request: pytest.FixtureRequest) -> bool:
    """Whether this is the full set (``--cluster=full``)."""
    return bool(request.config.getoption("--cluster") == "full")


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    work = Path(os.environ.get("PVESTORD_CLUSTER_OUT", REPO / "out" / "cluster"))
    if os.environ.get("PVESTORD_CLUSTER_ATTACH"):
        yield attach(work)  # a pair kept up by `python -m tests.harness.twonode`
        return
    with cluster_pair(work) as pair:
        print(f"\ntwo-node bed: both guests ready in {pair.boot_seconds:.1f} s")
        yield pair


@pytest.fixture(scope="session")
def daemons(cluster: Cluster) -> Iterator[Cluster]:
    """qmeventd-py and pvestord on both nodes; both must stop cleanly at the end."""
    cluster.write_storage_config(
        "dir: local\n\tpath /var/lib/vz\n\tcontent iso\n\n" + storage_section(cluster))
    for node in cluster.nodes:
        node.start_daemons(cluster, wait=False)
    for node in cluster.nodes:
        node.wait_started()
    yield cluster
    codes = {node.name: node.stop_daemons() for node in cluster.nodes}
    assert all(rc == 0 for c in codes.values() for rc in c.values()), codes


@pytest.fixture
def guest(daemons: Cluster) -> Iterator[Guest]:
    """A VM with a thin drive on the shared VG, running on A with its threshold
    armed; afterwards stopped, its image checked and its LV removed."""
    g = Guest(daemons)
    try:
        wait_until(lambda: threshold(daemons.a, g.vmid) == INITIAL - CHUNK // 2, 60,
                   "threshold armed on A")
        yield g
    finally:
        g.stop()
    # Remake the /dev links in case a node's udev dropped them (the check is
    # about the image, not the links).
    g.on.run(["vgmknodes", daemons.vg], check=False)
    check = g.on.run(["qemu-img", "check", g.path], check=False)
    for node in daemons.nodes:
        node.run(["lvchange", "-an", f"{daemons.vg}/{g.lv}"], check=False)
    g.on.run(["lvremove", "-q", "-f", f"{daemons.vg}/{g.lv}"], check=False)
    assert check.rc == 0, check.stdout + check.stderr
