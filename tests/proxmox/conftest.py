"""Proxmox's own storage code, unpacked once per test module.

A module that needs a storage.cfg in place overrides ``proxmox`` with a
fixture of the same name that asks for this one and writes it
(:func:`tests.proxmox.recorded.storage_cfg_fixture`).
"""

from __future__ import annotations

import pytest

from tests.proxmox import upstream


@pytest.fixture(scope="module")
def proxmox(tmp_path_factory: pytest.TempPathFactory) -> upstream.Upstream:
    """The sources from ``$PVESTORD_UPSTREAM_DIR``; the test is skipped, saying
    what is missing, without them."""
    reason = upstream.skip_reason()
    if reason is not None:
        pytest.skip(reason)
    return upstream.unpack(tmp_path_factory.mktemp("upstream"))
