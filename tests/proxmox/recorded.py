"""Proxmox's real PVE::Storage with LVM and qemu-img recorded instead of run.

The Perl side is ``PvestordTest/LvmRecorder.pm``, pvestord's reports come
from ``fake_lvm.py``; both read and write one JSON VG (see the recorder for
its layout). A :class:`Bed` runs Perl against it and reads back the commands
run and the LVs left. Runs on any machine with the Proxmox sources and the
Perl modules, without LVM.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pvestord.policy.sizes import GiB, MiB
from tests.proxmox import upstream

VENV_BIN = Path(sys.executable).parent
FAKE_LVM = Path(__file__).resolve().parent / "fake_lvm.py"


@dataclass(frozen=True)
class Bed:
    proxmox: upstream.Upstream
    state: Path
    log: Path
    locks_log: Path
    #: The stand-in locks in the order they were taken (PvestordTest/StandIns.pm).
    lock_order: Path
    #: The folder of the VG marks the bed's pvestord reads (``--vg-health-dir``).
    health_dir: Path
    env: dict[str, str]
    vg: str
    vg_size: int
    extent: int

    def run(self, code: str, **extra: str) -> Any:
        """``code`` (with ``$cfg``) after the LVM stand-in is installed; prints JSON.
        ``extra``: more environment (a fault to inject)."""
        return self.proxmox.perl_json(
            "require PvestordTest::LvmRecorder; PvestordTest::LvmRecorder::install();"
            f"my $cfg = PVE::Storage::config(); {code}", **{**self.env, **extra})

    def try_alloc(self, storeid: str, vmid: int, fmt: str, name: str, size_kib: float
                  ) -> dict[str, str]:
        """vdisk_alloc's volume id, or its error."""
        return self.run(  # type: ignore[no-any-return]
            f'my $volid = eval {{ PVE::Storage::vdisk_alloc($cfg, "{storeid}", {vmid},'
            f' "{fmt}", "{name}", {size_kib!r}) }};'
            'print encode_json({volid => $volid // "", error => "$@"});')

    def commands(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def commands_and_locks(self) -> list[tuple[list[str], list[str]]]:
        """Each command with the stand-in locks held while it ran."""
        if not self.locks_log.exists():
            return []
        return [(entry["command"], entry["locks"])
                for entry in map(json.loads, self.locks_log.read_text().splitlines())]

    def locks_taken(self) -> list[str]:
        """The stand-in locks taken, in order, since the log was last cleared."""
        if not self.lock_order.exists():
            return []
        return self.lock_order.read_text().split()

    def lvs(self) -> dict[str, Any]:
        return json.loads(self.state.read_text())["lvs"]  # type: ignore[no-any-return]

    def set_lvs(self, lvs: dict[str, Any]) -> None:
        """The VG's LVs as given (what another node or the admin did)."""
        self.state.write_text(json.dumps({"vg": self.vg, "size": self.vg_size,
                                          "extent": self.extent, "lvs": lvs}))

    def clear_log(self) -> None:
        self.log.unlink(missing_ok=True)
        self.locks_log.unlink(missing_ok=True)
        self.lock_order.unlink(missing_ok=True)

    def reset(self) -> None:
        self.set_lvs({})
        self.clear_log()


def make_bed(proxmox: upstream.Upstream, folder: Path, *, vg: str, vg_size: int,
             extent: int) -> Bed:
    """An empty VG of ``vg_size`` and the checkout's pvestord, set up in ``folder``."""
    pvestord = folder / "pvestord"
    # Its VG marks in the bed, never the node's /run/pvestord/vg-unhealthy.
    health = folder / "vg-unhealthy"
    pvestord.write_text(
        f"#!/bin/sh\nPYTHONPATH={upstream.REPO} exec {VENV_BIN / 'pvestord'} \"$@\""
        f" --vg-health-dir {health}\n")
    pvestord.chmod(0o755)
    lvm = folder / "lvm"
    lvm.write_text(f"#!/bin/sh\nexec {VENV_BIN / 'python'} {FAKE_LVM} \"$@\"\n")
    lvm.chmod(0o755)
    state, log, locks_log, lock_order = (folder / "vg.json", folder / "commands.jsonl",
                                         folder / "locks.jsonl", folder / "lock-order")
    bed = Bed(proxmox, state, log, locks_log, lock_order, health, {
        "PVESTORD_TEST_COMMAND": str(pvestord), "PVESTORD_LVM": str(lvm),
        "PVESTORD_TEST_LVM_STATE": str(state), "PVESTORD_TEST_LVM_LOG": str(log),
        "PVESTORD_TEST_LVM_LOCKS_LOG": str(locks_log),
        "PVESTORD_TEST_LOCK_ORDER_LOG": str(lock_order)}, vg, vg_size, extent)
    bed.reset()
    return bed


#: A ``pvestord`` storage and Proxmox's own ``lvm`` type on one VG: the bed of
#: the tests that hold what the plugin runs against what Proxmox runs for the
#: same request.
SHARED_VG = "vg_san1"
SHARED_EXTENT = 4 * MiB
SHARED_INITIAL_SIZE = 1 * GiB


def pvestord_section(storeid: str, *options: str) -> str:
    """A ``pvestord`` storage on SHARED_VG, ``initial-size`` 1G, with ``options`` ("key value")."""
    lines = [f"pvestord: {storeid}", f"vgname {SHARED_VG}", "content images", "shared 1",
             "snapshot-as-volume-chain 1", "pvestord-initial-size 1G", *options]
    return "\n\t".join(lines) + "\n"


#: The ``pvestord`` storage of most tests: 256 MiB chunks.
THIN1_SECTION = pvestord_section("thin1", "pvestord-chunksize 256M")
THIN_AND_THICK_CFG = THIN1_SECTION + f"""
lvm: thick1
\tvgname {SHARED_VG}
\tcontent images
\tshared 1
\tsnapshot-as-volume-chain 1
"""


def storage_cfg_fixture(storage_cfg: str) -> Any:
    """A test module's ``proxmox`` fixture: the sources (tests/proxmox/conftest.py)
    with ``storage_cfg`` written once for the module. At the module's top:
    ``proxmox = storage_cfg_fixture(CFG)``."""

    @pytest.fixture(scope="module", name="proxmox")
    def sources_with_storage_cfg(proxmox: upstream.Upstream) -> upstream.Upstream:
        proxmox.write_storage_cfg(storage_cfg)
        return proxmox

    return sources_with_storage_cfg


def empty_vg_fixture(*, vg: str = SHARED_VG, vg_size: int = 100 * GiB,
                     extent: int = SHARED_EXTENT) -> Any:
    """A test module's ``bed`` fixture: an empty VG for each test (by default
    THIN_AND_THICK_CFG's, 100 GiB). At the module's top: ``bed = empty_vg_fixture()``."""

    @pytest.fixture(name="bed")
    def empty_vg(proxmox: upstream.Upstream, tmp_path: Path) -> Bed:
        return make_bed(proxmox, tmp_path, vg=vg, vg_size=vg_size, extent=extent)

    return empty_vg


def lvcreates(commands: list[list[str]]) -> list[list[str]]:
    return [c for c in commands if c[0] == "/sbin/lvcreate"]
