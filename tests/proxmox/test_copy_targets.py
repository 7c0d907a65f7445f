"""Copies land thin: a copy target is thick while qemu-server copies into it
and reduced as soon as the copy is over, through the real PVE::Storage
(issue 37 item 1).

qemu-server's copy flows allocate from named subs (``COPY_FLOWS`` in
pvestord/features/plugin.py); the test calls ``vdisk_alloc`` from a sub of
that name, as ``clone_disk`` does. The plugin's ``deactivate_volume`` and
``activate_volume`` then have ``pvestord volume reduce-copy`` reduce the
LV to ``shrink_target``'s size and drop the copy tag.

LVM is the recording stand-in of :mod:`tests.proxmox.recorded`; pvestord's
own ``lvreduce`` and ``lvchange`` are carried out by ``fake_lvm.py``, which
logs the lock directories pvestord held meanwhile (its ``--lock-dir``:
pmxcfs-style directories, as on a shared storage). Every qemu-img pvestord
runs reads one real image file, logged with the same locks.
Runs on any machine with the Proxmox sources, the Perl modules and qemu-img.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pvestord.adapters import qemu_img
from pvestord.policy.capacity import COPY_TAG
from pvestord.policy.sizes import GiB, MiB
from pvestord.policy.volumes import shrink_target
from tests.proxmox import upstream
from tests.proxmox.recorded import (
    SHARED_VG,
    THIN1_SECTION,
    VENV_BIN,
    Bed,
    make_bed,
    storage_cfg_fixture,
)

VG = SHARED_VG
EXTENT = 4 * MiB
CHUNK = 256 * MiB
INITIAL = 1 * GiB
DISK = 4 * GiB
VOLNAME = "vm-100-disk-0.qcow2"
VOLID = f"thin1:{VOLNAME}"
STORAGE_CFG = THIN1_SECTION


proxmox = storage_cfg_fixture(STORAGE_CFG)


@dataclass(frozen=True)
class CopyBed:
    bed: Bed
    #: The image every LV of the VG is to pvestord's qemu-img.
    image: Path
    #: pvestord's LVM changes, each with the lock directories held meanwhile.
    lvm_log: Path
    #: pvestord's qemu-img runs, each with the lock directories held meanwhile.
    qemu_img_log: Path
    env: dict[str, str]
    #: pvestord's ``--run-dir``: where a QEMU's ``<vmid>.pid`` is.
    run_dir: Path

    def run(self, code: str) -> Any:
        return self.bed.run(code, **self.env)

    def lvm_changes(self) -> list[dict[str, Any]]:
        return _lines(self.lvm_log)

    def qemu_img_runs(self) -> list[dict[str, Any]]:
        return _lines(self.qemu_img_log)


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def copy_bed(proxmox: upstream.Upstream, tmp_path: Path) -> CopyBed:
    bed = make_bed(proxmox, tmp_path, vg=VG, vg_size=100 * GiB, extent=EXTENT)
    py_locks, run_dir, cluster = tmp_path / "py-locks", tmp_path / "run", tmp_path / "pve"
    py_locks.mkdir()
    run_dir.mkdir()
    cluster.mkdir()
    lvm_log, qemu_img_log = tmp_path / "py-lvm.jsonl", tmp_path / "qemu-img.jsonl"
    image = tmp_path / "image.qcow2"
    # The bed's pvestord, with a volume command's files in the bed as well.
    pvestord = f"PYTHONPATH={upstream.REPO} exec {VENV_BIN / 'pvestord'}"
    (tmp_path / "pvestord").write_text(
        "#!/bin/sh\n"
        f"if [ \"$1\" = volume ]; then {pvestord} \"$@\""
        f" --storage-config {proxmox.pve_dir / 'storage.cfg'} --lock-dir {py_locks}"
        f" --run-dir {run_dir} --cluster-dir {cluster} --vg-health-dir {bed.health_dir}; fi\n"
        f"{pvestord} \"$@\" --vg-health-dir {bed.health_dir}\n")
    real = shutil.which("qemu-img")
    assert real is not None
    wrapper = tmp_path / "qemu-img"
    wrapper.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"locks = sorted(os.listdir({str(py_locks)!r}))\n"
        f"with open({str(qemu_img_log)!r}, 'a') as log:\n"
        "    log.write(json.dumps({'command': sys.argv[1:], 'locks': locks}) + '\\n')\n"
        f"args = [{str(image)!r} if a.startswith('/dev/{VG}/') else a for a in sys.argv[1:]]\n"
        f"os.execv({real!r}, [{real!r}, *args])\n")
    wrapper.chmod(0o755)
    env = {"PVESTORD_QEMU_IMG": str(wrapper), "PVESTORD_TEST_PY_LVM_LOG": str(lvm_log),
           "PVESTORD_TEST_PY_LOCK_DIR": str(py_locks)}
    return CopyBed(bed, image, lvm_log, qemu_img_log, env, run_dir)


def alloc_copy_target(copy_bed: CopyBed) -> int:
    """``vdisk_alloc`` as ``clone_disk`` calls it; the LV's size."""
    made = copy_bed.run(
        'sub PVE::QemuServer::clone_disk {'
        f' return PVE::Storage::vdisk_alloc($cfg, "thin1", 100, "qcow2", "{VOLNAME}",'
        f' {DISK // 1024}) }}'
        'print encode_json({volid => PVE::QemuServer::clone_disk()});')
    assert made == {"volid": VOLID}
    lv = copy_bed.bed.lvs()[VOLNAME]
    assert COPY_TAG in lv["tags"]
    return int(lv["size"])


def write_image(image: Path, data: int) -> None:
    """The image as a copy leaves it: ``data`` bytes written from its start."""
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), str(DISK)],  # noqa: S603
                   check=True, timeout=60)
    if data:
        subprocess.run(["qemu-io", "-f", "qcow2", "-c", f"write -P 0x5a 0 {data}",  # noqa: S603
                        str(image)], check=True, timeout=60, capture_output=True)


def expected_size(image: Path, lv_size: int) -> int:
    checked = asyncio.run(qemu_img.check(image))
    assert checked.image_end_offset is not None
    return shrink_target(lv_size, checked.image_end_offset, CHUNK, INITIAL, EXTENT)


def test_a_copy_target_is_allocated_thick_and_tagged(copy_bed: CopyBed) -> None:
    size = alloc_copy_target(copy_bed)
    assert size > DISK


def test_deactivation_reduces_a_copy_target_and_drops_its_tag(copy_bed: CopyBed) -> None:
    thick = alloc_copy_target(copy_bed)
    write_image(copy_bed.image, 64 * MiB)
    copy_bed.run(f'PVE::Storage::deactivate_volumes($cfg, ["{VOLID}"]); print "{{}}";')
    lv = copy_bed.bed.lvs()[VOLNAME]
    assert lv["size"] == expected_size(copy_bed.image, thick) < thick
    assert COPY_TAG not in lv["tags"]
    assert "pve-vm-100" in lv["tags"]


def test_the_lock_is_held_for_the_reduction_and_not_for_the_check(copy_bed: CopyBed) -> None:
    alloc_copy_target(copy_bed)
    write_image(copy_bed.image, 64 * MiB)
    copy_bed.run(f'PVE::Storage::deactivate_volumes($cfg, ["{VOLID}"]); print "{{}}";')
    changes = copy_bed.lvm_changes()
    assert [c["command"][0] for c in changes] == ["lvreduce", "lvchange"]
    assert all("storage-thin1" in c["locks"] for c in changes), changes
    checks = [r for r in copy_bed.qemu_img_runs() if r["command"][0] == "check"]
    # Before the reduction (outside the lock), and once after it.
    assert len(checks) == 2
    assert all(r["locks"] == [] for r in checks), checks


def test_activation_of_the_empty_target_changes_nothing(copy_bed: CopyBed) -> None:
    """clone_disk's order: vdisk_alloc, activate_volumes, then the copy."""
    thick = alloc_copy_target(copy_bed)
    write_image(copy_bed.image, 0)
    copy_bed.run(f'PVE::Storage::activate_volumes($cfg, ["{VOLID}"]); print "{{}}";')
    lv = copy_bed.bed.lvs()[VOLNAME]
    assert lv["size"] == thick
    assert COPY_TAG in lv["tags"]
    assert copy_bed.lvm_changes() == []


def test_activation_of_a_written_closed_target_reduces_it(copy_bed: CopyBed) -> None:
    """A same-node clone: the copy done, never deactivated; the next activation."""
    thick = alloc_copy_target(copy_bed)
    write_image(copy_bed.image, 64 * MiB)
    copy_bed.run(f'PVE::Storage::activate_volumes($cfg, ["{VOLID}"]); print "{{}}";')
    lv = copy_bed.bed.lvs()[VOLNAME]
    assert lv["size"] == expected_size(copy_bed.image, thick) < thick
    assert COPY_TAG not in lv["tags"]


def test_a_refusal_keeps_the_tag_and_still_deactivates(copy_bed: CopyBed) -> None:
    """The LV open on this node (a mirror's target whose VM still runs)."""
    thick = alloc_copy_target(copy_bed)
    write_image(copy_bed.image, 64 * MiB)
    state = json.loads(copy_bed.bed.state.read_text())
    state["lvs"][VOLNAME]["open"] = True
    copy_bed.bed.state.write_text(json.dumps(state))
    found = copy_bed.run(
        'my @deactivated;'
        'my $lvm = \\&PVE::Storage::LVMPlugin::deactivate_volume;'
        '{ no warnings "redefine";'
        '  *PVE::Storage::LVMPlugin::deactivate_volume = sub {'
        '    push @deactivated, $_[3]; return $lvm->(@_) }; }'
        f'eval {{ PVE::Storage::deactivate_volumes($cfg, ["{VOLID}"]) }};'
        'print encode_json({error => "$@", deactivated => \\@deactivated});')
    assert found == {"error": "", "deactivated": [VOLNAME]}
    lv = copy_bed.bed.lvs()[VOLNAME]
    assert lv["size"] == thick
    assert COPY_TAG in lv["tags"]
    assert copy_bed.lvm_changes() == []


def test_a_thin_volume_is_left_to_lvm(copy_bed: CopyBed) -> None:
    """No copy tag: activation and deactivation are LVMPlugin's alone."""
    made = copy_bed.bed.try_alloc("thin1", 100, "qcow2", VOLNAME, DISK // 1024)
    assert made == {"volid": VOLID, "error": ""}
    write_image(copy_bed.image, 64 * MiB)
    copy_bed.run(f'PVE::Storage::activate_volumes($cfg, ["{VOLID}"]);'
                 f'PVE::Storage::deactivate_volumes($cfg, ["{VOLID}"]); print "{{}}";')
    assert copy_bed.bed.lvs()[VOLNAME]["size"] == INITIAL
    assert copy_bed.qemu_img_runs() == []


def test_a_vm_running_here_keeps_its_copy_target_as_it_is(copy_bed: CopyBed) -> None:
    """VM 100 runs on this node (a live process names its pid file)."""
    thick = alloc_copy_target(copy_bed)
    write_image(copy_bed.image, 64 * MiB)
    pidfile = copy_bed.run_dir / "100.pid"
    qemu = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)",  # noqa: S603
                             "-pidfile", str(pidfile)])
    try:
        pidfile.write_text(f"{qemu.pid}\n")
        found = copy_bed.run(f'eval {{ PVE::Storage::activate_volumes($cfg, ["{VOLID}"]);'
                             f' PVE::Storage::deactivate_volumes($cfg, ["{VOLID}"]) }};'
                             'print encode_json({error => "$@"});')
    finally:
        qemu.kill()
        qemu.wait(timeout=60)
    assert found == {"error": ""}
    lv = copy_bed.bed.lvs()[VOLNAME]
    assert lv["size"] == thick
    assert COPY_TAG in lv["tags"]
    assert copy_bed.lvm_changes() == []
    # Refused before the image was checked at all.
    assert [r for r in copy_bed.qemu_img_runs() if r["command"][0] == "check"] == []


# --- a snapshot delete's merge target (issue 37 item 2) --------------------------------------

SNAP_LV = "snap_vm-100-disk-0_s1.qcow2"


def test_a_live_snapshot_deletes_merge_target_is_reduced_when_the_vm_stops(
        copy_bed: CopyBed) -> None:
    """qemu-server's online delete of the first snapshot reads the chain right
    before its block-commit of the top into the snapshot's LV: the plugin grows
    that LV and tags it. QEMU has it open meanwhile; the VM's stop deactivates
    the volume, and the snapshot LV of the chain, tagged, is reduced then."""
    made = copy_bed.bed.try_alloc("thin1", 100, "qcow2", VOLNAME, DISK // 1024)
    assert made == {"volid": VOLID, "error": ""}
    copy_bed.run(f'PVE::Storage::volume_snapshot($cfg, "{VOLID}", "s1"); print "{{}}";')
    assert set(copy_bed.bed.lvs()) == {VOLNAME, SNAP_LV}
    write_image(copy_bed.image, 64 * MiB)   # what the commit leaves in the snapshot's LV
    copy_bed.run('sub PVE::QemuServer::qemu_volume_snapshot_delete {'
                 ' my ($vmid, $storecfg, $drive, $snap) = @_;'
                 ' PVE::Storage::volume_snapshot_info($storecfg, $drive->{file}); 1 }'
                 f'PVE::QemuServer::qemu_volume_snapshot_delete(100, $cfg,'
                 f' {{ file => "{VOLID}" }}, "s1"); print "{{}}";')
    grown = copy_bed.bed.lvs()[SNAP_LV]
    assert grown["size"] > INITIAL
    assert COPY_TAG in grown["tags"]
    assert COPY_TAG not in copy_bed.bed.lvs()[VOLNAME]["tags"]
    copy_bed.run(f'PVE::Storage::deactivate_volumes($cfg, ["{VOLID}"]); print "{{}}";')
    lv = copy_bed.bed.lvs()[SNAP_LV]
    assert lv["size"] == expected_size(copy_bed.image, grown["size"]) < grown["size"]
    assert COPY_TAG not in lv["tags"]
    assert copy_bed.bed.lvs()[VOLNAME]["size"] == INITIAL
    reduced = [c["command"][-1] for c in copy_bed.lvm_changes() if c["command"][0] == "lvreduce"]
    assert reduced == [f"{VG}/{SNAP_LV}"]


def test_an_lv_of_another_disk_is_not_part_of_the_chain(copy_bed: CopyBed) -> None:
    """vm-100-disk-0's deactivation reduces its own chain's copy targets only,
    not vm-100-disk-01's (whose name begins like it)."""
    for name in (VOLNAME, "vm-100-disk-01.qcow2"):
        made = copy_bed.bed.try_alloc("thin1", 100, "qcow2", name, DISK // 1024)
        assert made["error"] == ""
    lvs = copy_bed.bed.lvs()
    lvs["vm-100-disk-01.qcow2"]["tags"].append(COPY_TAG)
    lvs["vm-100-disk-01.qcow2"]["size"] = 2 * GiB
    copy_bed.bed.set_lvs(lvs)
    write_image(copy_bed.image, 64 * MiB)
    copy_bed.run(f'PVE::Storage::deactivate_volumes($cfg, ["{VOLID}"]); print "{{}}";')
    assert copy_bed.lvm_changes() == []
    assert copy_bed.bed.lvs()["vm-100-disk-01.qcow2"]["size"] == 2 * GiB


def test_an_offline_snapshot_delete_reduces_its_merge_target_after_the_merge_only(
        copy_bed: CopyBed) -> None:
    """Offline, the plugin grows the snapshot's LV for the commit, then hands
    over to LVMPlugin's delete, whose first step is an activation of the
    volume (the plugin's activate_volume): the LV must keep its room until the
    commit has written into it, and be reduced right after, under its new name.
    LVMPlugin's delete is replaced by one that does what the real one does to
    the LVs (activate, commit, remove the top, rename) and records the
    target's size when the commit would run."""
    made = copy_bed.bed.try_alloc("thin1", 100, "qcow2", VOLNAME, DISK // 1024)
    assert made == {"volid": VOLID, "error": ""}
    copy_bed.run(f'PVE::Storage::volume_snapshot($cfg, "{VOLID}", "s1"); print "{{}}";')
    write_image(copy_bed.image, 64 * MiB)
    seen = copy_bed.run(
        'my $at_commit;'
        '{ no warnings "redefine";'
        '  *PVE::Storage::LVMPlugin::volume_snapshot_delete = sub {'
        '    my ($class, $scfg, $storeid, $volname, $snap, $running) = @_;'
        '    $class->activate_volume($storeid, $scfg, $volname);'
        '    my $vg = $scfg->{vgname};'
        '    my $lvs = PVE::Storage::LVMPlugin::lvm_list_volumes($vg);'
        f'    $at_commit = $lvs->{{$vg}}->{{"{SNAP_LV}"}};'
        '    PVE::Storage::LVMPlugin::run_command(["/sbin/lvremove", "-f", "$vg/$volname"]);'
        f'    PVE::Storage::LVMPlugin::run_command(["/sbin/lvrename", $vg, "{SNAP_LV}",'
        '      $volname]);'
        '  }; }'
        f'PVE::Storage::volume_snapshot_delete($cfg, "{VOLID}", "s1", 0);'
        'print encode_json({size => $at_commit->{lv_size} + 0, tags => $at_commit->{tags}});')
    assert seen["size"] > INITIAL, "reduced before the commit wrote into it"
    assert COPY_TAG in seen["tags"].split(",")
    lvs = copy_bed.bed.lvs()
    assert set(lvs) == {VOLNAME}
    assert lvs[VOLNAME]["size"] == expected_size(copy_bed.image, seen["size"]) < seen["size"]
    assert COPY_TAG not in lvs[VOLNAME]["tags"]


def test_a_migration_source_leaves_the_target_to_reduce_it(copy_bed: CopyBed) -> None:
    """A live migration's source stops its QEMU and deactivates the volumes
    once the config has moved: the LV is not open here and the VM not running
    here, but the target's QEMU writes it. pmxcfs's .vmlist placing the VM on
    another node refuses; the tag stays for that node to reduce it at the VM's stop."""
    thick = alloc_copy_target(copy_bed)
    write_image(copy_bed.image, 64 * MiB)
    cluster = copy_bed.run_dir.parent / "pve"
    (cluster / ".members").write_text(json.dumps({"nodename": "nodea", "version": 3, "cluster": {
        "name": "c", "version": 2, "nodes": 2, "quorate": 1}}))
    (cluster / ".vmlist").write_text(json.dumps(
        {"version": 4, "ids": {"100": {"node": "nodeb", "type": "qemu", "version": 9}}}))
    found = copy_bed.run(f'eval {{ PVE::Storage::deactivate_volumes($cfg, ["{VOLID}"]) }};'
                         'print encode_json({error => "$@"});')
    assert found == {"error": ""}
    lv = copy_bed.bed.lvs()[VOLNAME]
    assert lv["size"] == thick
    assert COPY_TAG in lv["tags"]
    assert copy_bed.lvm_changes() == []
    # Back on this node (migrated back, or never gone): reduced.
    (cluster / ".vmlist").write_text(json.dumps(
        {"version": 5, "ids": {"100": {"node": "nodea", "type": "qemu", "version": 9}}}))
    copy_bed.run(f'PVE::Storage::deactivate_volumes($cfg, ["{VOLID}"]); print "{{}}";')
    assert copy_bed.bed.lvs()[VOLNAME]["size"] == expected_size(copy_bed.image, thick) < thick
