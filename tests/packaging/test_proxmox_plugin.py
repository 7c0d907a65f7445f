"""The storage plugin the package installs loads into Proxmox's real PVE::Storage.

The installed root's ``usr/share/perl5`` is laid over this machine's in a
private mount namespace, and upstream's own loader (which scans
``/usr/share/perl5/PVE/Storage/Custom``, checks the plugin's ancestry and
``api()``) registers it; a ``pvestord:`` section then parses with its thin
options. Skipped, saying what is missing, without the Proxmox sources.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.proxmox import upstream

INSTALLED = "usr/share/perl5/PVE/Storage/Custom/PvestordPlugin.pm"


def test_installed_plugin_loads_into_real_pve_storage(installed_root: Path,
                                                      tmp_path: Path) -> None:
    assert (installed_root / INSTALLED).is_file()
    reason = upstream.skip_reason()
    if reason is not None:
        pytest.skip(reason)
    pve = upstream.unpack(tmp_path / "upstream")
    pve.write_storage_cfg("pvestord: thin1\n\tvgname vg_san1\n\tshared 1\n"
                          "\tsnapshot-as-volume-chain 1\n\tpvestord-chunksize 256M\n"
                          "\tpvestord-chunk-percentage 0.25\n\tpvestord-initial-size 1G\n")
    done = pve.perl_installed(
        'print encode_json({file => $INC{"PVE/Storage/Custom/PvestordPlugin.pm"},'
        ' thin1 => PVE::Storage::config()->{ids}{thin1}});',
        installed_root / "usr/share/perl5")
    assert done.returncode == 0, done.stderr
    assert "Error loading storage plugin" not in done.stderr, done.stderr
    found = json.loads(done.stdout)
    assert found["file"] == f"/{INSTALLED}"
    assert found["thin1"]["type"] == "pvestord"
    assert (found["thin1"]["pvestord-chunksize"],
            found["thin1"]["pvestord-initial-size"]) == ("256M", "1G")
