"""The two-node tier: two node guests on one SAN, driven from the host.

The pair boots once per session (``make cluster``); its consoles and every
daemon's and QEMU's log stay in ``out/cluster`` for reading after a failure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.twonode import REPO, Cluster, cluster_pair


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    work = Path(os.environ.get("PVESTORD_CLUSTER_OUT", REPO / "out" / "cluster"))
    with cluster_pair(work) as pair:
        print(f"\ntwo-node bed: both guests ready in {pair.boot_seconds:.1f} s")
        yield pair
