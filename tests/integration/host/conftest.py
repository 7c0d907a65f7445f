"""Fixtures for the host tier: real QEMU processes on plain files, no LVM."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.qemu import QEMU_ENV


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Tests marked root need real privileges (peer uid 0, setuid children).
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _qemu_available() -> None:
    qemu = os.environ.get(QEMU_ENV, "qemu-system-x86_64")
    if shutil.which(qemu) is None:
        pytest.fail(f"{qemu} is not on PATH: the host tier needs a real QEMU")


@pytest.fixture
def run_dir() -> Iterator[Path]:
    """A short folder for sockets and pidfiles (unix socket paths max 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="pvq-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
