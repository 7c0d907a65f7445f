"""A small VG filling up under the capacity guards (node guest): real LVM,
real QEMU, the real daemons and ``pvestord volume create``.

One story, step by step, as an admin would meet it: the VG falls below
``thin-warn-free`` (one journal warning, ``status`` says ``warn``), below
``thin-critical-free`` (new thin volumes refused, the running VM still
grows), and below what an extension may take without eating the reserve
(the drive waits, held, until room comes back). Thick "filler" LVs stand for
the other users of a shared VG.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.daemonlog import parse
from tests.harness.daemons import VENV_BIN, Daemon, NodeBed, ThinStorageSpec, daemons
from tests.harness.lvmbed import VG, GiB, MiB, loop_vg, qcow2_check, sh
from tests.harness.polling import wait_until
from tests.harness.qemu import Pve9Disk, QemuVM

CLI_TIMEOUT = 300.0
START_TIMEOUT = 180.0
EXTEND_TIMEOUT = 180.0
CHUNK = 32 * MiB
#: chunk-percentage 0.5: the threshold sits half a chunk below the LV's end.
HEADROOM = CHUNK // 2
# pvestord-thin-reserve unset: one chunk.
GUARDS = "\tpvestord-thin-warn-free 60%\n\tpvestord-thin-critical-free 30%\n"
#: The guest's writes, in order and back to back: qcow2 allocates clusters at
#: the image's end whatever the guest offset, so each write moves the LV's
#: highest written offset past the next threshold (+ half a chunk of margin
#: below the LV's end). (offset, length, pattern)
WRITES = ((0, CHUNK - HEADROOM + 8 * MiB, 0x41),
          (CHUNK - HEADROOM + 8 * MiB, CHUNK, 0x42),
          (2 * CHUNK - HEADROOM + 8 * MiB, CHUNK, 0x43))


@pytest.fixture
def vg() -> Iterator[VG]:
    with loop_vg(1 * GiB) as vg:
        yield vg


@pytest.fixture
def bed(vg: VG, tmp_path: Path, out_dir: Path) -> NodeBed:
    bed = NodeBed(tmp_path, [ThinStorageSpec("thin1", vg.name, chunksize="32M",
                                             initial_size="32M")], logs_dir=out_dir)
    bed.storage_cfg.write_text(bed.storage_cfg.read_text() + GUARDS)
    return bed


def vg_figures(vg: VG) -> tuple[int, int]:
    """(size, free) of ``vg`` in bytes, as LVM says now."""
    out = sh("vgs", "--reportformat", "json", "--units", "b", "--nosuffix", "-o",
             "vg_size,vg_free", vg.name)
    row = json.loads(out)["report"][0]["vg"][0]
    return int(row["vg_size"]), int(row["vg_free"])


def fill_to(vg: VG, name: str, free: int) -> None:
    """A thick LV that leaves about ``free`` bytes free (whole extents)."""
    extent = vg.extent_size()
    _, now = vg_figures(vg)
    take = (now - free) // extent * extent
    assert take > 0, (now, free)
    sh("lvcreate", "-q", "-an", "-Zn", "-L", f"{take}b", "-n", name, vg.name)


def volume_create(bed: NodeBed, vmid: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - argument list
        [str(VENV_BIN / "pvestord"), "volume", "create", "--storage-config",
         str(bed.storage_cfg), "thin1", str(vmid), "4G"],
        capture_output=True, text=True, timeout=CLI_TIMEOUT, stdin=subprocess.DEVNULL,
        check=False)


def status(status_file: Path) -> dict[str, Any]:
    done = subprocess.run(  # noqa: S603 - argument list
        [str(VENV_BIN / "pvestord"), "status", "--json", "--file", str(status_file)],
        capture_output=True, text=True, timeout=CLI_TIMEOUT, check=False)
    view: dict[str, Any] = json.loads(done.stdout) if done.stdout else {}
    return view


def drive_state(status_file: Path, vmid: int, block_node: str) -> str | None:
    if not status_file.exists():
        return None
    return next((d["state"] for d in status(status_file).get("drives", [])
                 if d["vmid"] == vmid and d["block_node"] == block_node), None)


def warnings_with(daemon: Daemon, **fields: str) -> list[dict[str, str]]:
    return [line.fields for line in parse(daemon.log_text()) if line.level == "WARNING"
            and all(line.fields.get(k) == v for k, v in fields.items())]


def test_a_filling_vg_warns_refuses_new_volumes_and_keeps_the_reserve(
        bed: NodeBed, vg: VG, tmp_path: Path, out_dir: Path) -> None:
    size, _ = vg_figures(vg)
    fill_to(vg, "filler-a", size * 55 // 100)  # below the warning's 60 %
    created = volume_create(bed, 150)
    assert created.returncode == 0, created.stderr  # above the critical 30 %: allowed
    lv = created.stdout.strip().split(":")[1]
    assert vg.lv_size(lv) == CHUNK

    status_file = tmp_path / "run-pvestord" / "status.json"
    disk = Pve9Disk.for_volume(vg.lv_path(lv), created.stdout.strip())
    file_node = disk.file_block_node
    vm = QemuVM(150, bed.run_dir, disks=[disk],
                event_socket=bed.event_socket, log_path=bed.logs / "qemu-150.log",
                launch_timeout=START_TIMEOUT)
    with daemons(bed, pvestord_args=("--reconcile-interval", "5", "--vg-health-dir",
                                     str(status_file.parent / "vg-unhealthy"))) as (_, pvestord), \
            vm:
        # Below thin-warn-free: said once in the journal, and in status.
        wait_until(lambda: warnings_with(pvestord, VG=vg.name, CAPACITY_LEVEL="warn"),
                   START_TIMEOUT, "the VG's warning level in the journal")
        wait_until(lambda: status_file.exists()
                   and status(status_file)["vgs"].get(vg.name, {}).get("health") == "warn",
                   START_TIMEOUT, "status showing the VG at warn")

        wait_until(lambda: vm.named_node(file_node)["write_threshold"] == CHUNK - HEADROOM,
                   START_TIMEOUT, "the threshold armed")
        vm.write_pattern(disk.block_node, *WRITES[0], timeout=120)
        wait_until(lambda: vg.lv_size(lv) == 2 * CHUNK, EXTEND_TIMEOUT, "a first chunk")

        # Below thin-critical-free: no new thin volume, the running VM grows on.
        fill_to(vg, "filler-b", size * 25 // 100)
        refused = volume_create(bed, 151)
        assert refused.returncode == 1, (refused.stdout, refused.stderr)
        assert "pvestord-thin-critical-free" in refused.stderr, refused.stderr
        assert not any(name.startswith("vm-151-") for name in lv_names(vg))
        wait_until(lambda: vm.named_node(file_node)["write_threshold"] == 2 * CHUNK - HEADROOM,
                   EXTEND_TIMEOUT, "the threshold re-armed")
        vm.write_pattern(disk.block_node, *WRITES[1], timeout=120)
        wait_until(lambda: vg.lv_size(lv) == 3 * CHUNK, EXTEND_TIMEOUT, "a chunk while critical")

        # Less free than a chunk plus the reserve: the running VM's drive waits.
        fill_to(vg, "filler-c", CHUNK + CHUNK // 2)
        wait_until(lambda: vm.named_node(file_node)["write_threshold"] == 3 * CHUNK - HEADROOM,
                   EXTEND_TIMEOUT, "the threshold re-armed again")
        vm.write_pattern(disk.block_node, *WRITES[2], timeout=120)
        wait_until(lambda: drive_state(status_file, 150, file_node) == "held-by-reserve",
                   EXTEND_TIMEOUT, "the drive held by the reserve in status")
        assert vg.lv_size(lv) == 3 * CHUNK
        held = warnings_with(pvestord, VMID="150", VG=vg.name)
        assert [w.get("BLOCK_NODE") for w in held] == [file_node], held  # said once

        # Room again (another user's LV removed): the held drive gets its chunk.
        sh("lvremove", "-q", "-y", f"{vg.name}/filler-c")
        wait_until(lambda: vg.lv_size(lv) == 4 * CHUNK, EXTEND_TIMEOUT,
                   "the held chunk once room came back")
        for offset, length, pattern in WRITES:
            assert vm.read_verify(disk.block_node, offset, length, pattern, timeout=120)
        view = status(status_file)
        assert view["live"] is True, view.get("problem")
        assert view["extensions"]["made"] == 3
        assert view["extensions"]["failed"] == 0
        (out_dir / "capacity.json").write_text(json.dumps(
            {"vg": view["vgs"].get(vg.name), "last": view["extensions"]["last"]}, indent=1))
    assert qcow2_check(vg.lv_path(lv))["exit"] == 0


def lv_names(vg: VG) -> list[str]:
    out = sh("lvs", "--reportformat", "json", "-o", "lv_name", vg.name)
    return [row["lv_name"] for row in json.loads(out)["report"][0]["lv"]]


def recorded_maxima(vg: VG) -> dict[str, int]:
    """Each LV's ``pvestord-max-<bytes>`` tag, as any node reads it (VG metadata)."""
    out = sh("lvs", "--reportformat", "json", "-o", "lv_name,lv_tags", vg.name)
    found: dict[str, int] = {}
    for row in json.loads(out)["report"][0]["lv"]:
        for tag in filter(None, row["lv_tags"].split(",")):
            if tag.startswith("pvestord-max-"):
                found[row["lv_name"]] = int(tag.removeprefix("pvestord-max-"))
    return found


def vg_account(bed: NodeBed, vg: VG, status_file: Path) -> dict[str, Any]:
    """The VG's account as a freshly started daemon publishes it (its first
    account is read at start)."""
    status_file.unlink(missing_ok=True)
    with daemons(bed, pvestord_args=("--vg-health-dir",
                                     str(status_file.parent / "vg-unhealthy"))):
        wait_until(lambda: status_file.exists()
                   and vg.name in status(status_file).get("vgs", {}),
                   START_TIMEOUT, "the VG's account in status")
        account: dict[str, Any] = status(status_file)["vgs"][vg.name]
    return account


def test_every_node_reports_the_same_overcommit_whatever_is_active_on_it(
        bed: NodeBed, vg: VG, tmp_path: Path, out_dir: Path) -> None:
    """Two thin volumes made here, then one deactivated, as
    another node's VM would be to this node: the account (maxima, overcommit)
    must not change, because it comes from the LVs' tags, not from what this
    node can open. A thick LV named as a guest volume without the tag (made by
    Proxmox's lvm type, or before the tag) counts at its LV size, once
    in ``unmeasured`` on both views."""
    made = [volume_create(bed, vmid) for vmid in (160, 161)]
    assert all(done.returncode == 0 for done in made), [done.stderr for done in made]
    first, second = (done.stdout.strip().split(":")[1] for done in made)
    sh("lvcreate", "-q", "-an", "-Zn", "-L", "64m", "-n", "vm-162-disk-0", vg.name)
    maxima = recorded_maxima(vg)
    assert set(maxima) == {first, second}, maxima
    # volume_create makes 4 GiB images: the maximum is past the virtual size.
    assert all(maximum > 4 * GiB for maximum in maxima.values()), maxima
    status_file = tmp_path / "run-pvestord" / "status.json"

    both_active = vg_account(bed, vg, status_file)
    sh("lvchange", "-an", f"{vg.name}/{second}")
    one_elsewhere = vg_account(bed, vg, status_file)

    (out_dir / "capacity-views.json").write_text(json.dumps(
        {"both_active": both_active, "one_elsewhere": one_elsewhere, "maxima": maxima},
        indent=1))
    same = ("size", "free", "thin_allocated", "thin_virtual", "unmeasured", "overcommit",
            "committed")
    assert {k: both_active[k] for k in same} == {k: one_elsewhere[k] for k in same}
    assert both_active["thin_virtual"] == sum(maxima.values()) + 64 * MiB
    assert both_active["unmeasured"] == 1  # vm-162-disk-0: no tag, at its LV size
