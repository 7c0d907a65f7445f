"""Scenario 9: block jobs and whole-disk copies into a pvestord volume, against the
same into a thick LV.

A running VM's snapshot delete and a live move disk are QEMU block jobs that
write at the node's full speed, and qemu-server gives them no ``on-error``:
the first ENOSPC fails the job. An offline move disk, a full clone of a
stopped VM and an import are a ``qemu-img convert`` with nobody to grow the
target. pvestord's storage plugin therefore makes their room before they
start (packaging/perl, pvestord/features/plugin.py), and makes a copy's
target thin once the copy is over:

- **commit**: deleting a running VM's first snapshot is an active
  ``block-commit`` of the disk into the snapshot's LV. On a pvestord storage
  that LV is small; the plugin grows it by the source's LV plus a chunk when
  qemu-server reads the chain right before the job. Against: the same LV at
  the image's maximum, as Proxmox's own ``lvm`` type leaves it, with
  ``preallocation=metadata``.
- **mirror**: a move disk of a running VM onto the storage (or the target of
  a migration with local disks) is a ``blockdev-mirror`` into a volume the
  plugin allocates for a copy: an LV at the maximum, tagged ``pvestord-copy``,
  and a qcow2 without preallocation. When the VM stops, Proxmox deactivates
  the volume and the plugin reduces it (``pvestord volume reduce-copy``).
  Against: Proxmox's ``lvm`` type's volume, the same LV with
  ``preallocation=metadata``.
- **convert**: the same copy offline, ``qemu-img convert -n`` into the
  allocated volume as qemu-server's ``qemu_img_convert`` does (move disk,
  full clone and import of a stopped VM), then its reduction at the
  deactivation that ends the task; the copy is compared byte for byte.

Restores (vma, PBS) allocate the same copy target and are not run here:
their tools (``vma``, ``proxmox-backup-client``) are not on this node.

Each round sets up both sides alike (the same source data, written before
the clock starts) and runs them in turn, pvestord's side first in odd
rounds and second in even ones, so that a change of load hits both. A job's
time runs from the QMP command to ``BLOCK_JOB_COMPLETED``, a convert's is the
command's; the plugin's own preparation (its decision as ``pvestord plugin``
and the LVM command) and the reduction, which qemu-server's task runs
before and after, are reported beside. The figures are the speed ratio,
thick time over pvestord's (target at least 0.9 for the commit, 0.95 for the
copies), the count of failed jobs and copies (an ENOSPC included; target
0), and each flow's LV when it is over, on both sides.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.report import Figure, ratio, summary
from pvestord.policy.proxmox import qcow2_disk_vmid
from tests.harness.daemons import VENV_BIN
from tests.harness.lvmbed import VG, GiB, MiB, loop_vg, measured_maximum, scratch_dir, sh
from tests.harness.qemu import Pve9Disk, QemuVM, create_qcow2, image_io

#: The disk's virtual size, and the storage's thin settings.
DISK = 4 * GiB
CHUNK = 32 * MiB
INITIAL = 64 * MiB
#: What the snapshot's LV holds before the job.
BASE_DATA = 8 * MiB
#: Where the job's data lies in the disk: past the base's data.
DATA_OFFSET = GiB
JOB_TIMEOUT = 900.0
QEMU_IO_TIMEOUT = 900.0
PLUGIN_TIMEOUT = 300.0
VMID = 9100
STORE = "bench"
#: The target of the speed ratio (thick time over pvestord's time), per flow.
SPEED_TARGETS = {"commit": 0.9, "mirror": 0.95, "convert": 0.95}
KINDS = ("pvestord", "thick")
FLOWS = tuple(SPEED_TARGETS)


@dataclass(frozen=True)
class JobRun:
    kind: str
    #: Seconds from the job's QMP command to BLOCK_JOB_COMPLETED.
    job: float
    #: Seconds of the plugin's preparation before the job (0 for thick).
    prepare: float
    #: The job failed, or QEMU reported a job error on the way; for a
    #: convert: it failed, or the copy differs from its source.
    failed: bool
    #: The LV that received the data, once the flow is over (a copy target
    #: after its reduction).
    lv_after: int
    #: Seconds of the copy target's reduction after the copy (0 if none).
    reduce: float = 0.0


def run(rounds: int, data: int) -> dict[str, Any]:
    """``rounds`` rounds of every flow on both sides, ``data`` bytes copied each."""
    runs: dict[str, list[JobRun]] = {flow: [] for flow in FLOWS}
    # QMP sockets cannot live on the guest's shared result folder.
    run_dir = scratch_dir() / "blockjobs"
    run_dir.mkdir(parents=True, exist_ok=True)
    with loop_vg(2 * len(KINDS) * (DISK + GiB), prefix="pvb") as vg:
        volumes = VolumeCommands(vg, run_dir)
        maximum = measured_maximum(DISK, vg.extent_size())
        for round_no in range(rounds):
            order = KINDS if round_no % 2 == 0 else KINDS[::-1]
            for kind in order:
                runs["commit"].append(_commit(vg, run_dir, kind, data, maximum))
                runs["mirror"].append(_mirror(vg, volumes, kind, data, maximum))
                runs["convert"].append(_convert(vg, volumes, kind, data, maximum))
    result: dict[str, Any] = {"rounds": rounds, "data_bytes": data, "interleaved": True,
                              "maximum_bytes": maximum}
    for flow, done in runs.items():
        result[flow] = {kind: {"job_seconds": summary([r.job for r in done if r.kind == kind]),
                               "prepare_seconds": summary([r.prepare for r in done
                                                           if r.kind == kind]),
                               "reduce_seconds": summary([r.reduce for r in done
                                                          if r.kind == kind]),
                               "lv_after_bytes": max(r.lv_after for r in done
                                                     if r.kind == kind),
                               "failed": sum(r.failed for r in done if r.kind == kind)}
                        for kind in KINDS}
    return result


def _commit(vg: VG, run_dir: Path, kind: str, data: int, maximum: int) -> JobRun:
    """A running VM's first snapshot deleted: the top committed into the snapshot's LV."""
    base, top = "snap_vm-9100-disk-0_s.qcow2", "vm-9100-disk-0.qcow2"
    thin = kind == "pvestord"
    vg.create_lv(base, INITIAL if thin else maximum)
    create_qcow2(vg.lv_path(base), DISK, options=() if thin else ("preallocation=metadata",))
    qemu_io(vg.lv_path(base), f"write -P 0x11 0 {BASE_DATA}")
    # The top as the daemon left it: grown chunk by chunk to hold what the guest wrote.
    vg.create_lv(top, data + INITIAL)
    create_qcow2(vg.lv_path(top), DISK,
                 options=(f"backing_file={base}", "backing_fmt=qcow2",
                          "cluster_size=128k", "extended_l2=on"))
    qemu_io(vg.lv_path(top), f"write -P 0x22 {DATA_OFFSET} {data}")
    disk = Pve9Disk.for_volume(vg.lv_path(top), f"{STORE}:{top}")
    try:
        with QemuVM(VMID, run_dir, disks=[disk]) as vm:
            began = time.monotonic()
            if thin:
                _grow(vg, base, ask_plugin(vg, {"op": "commit", "target_lv": base,
                                             "source_lv": top, "virtual_size": DISK,
                                             "running": True}))
            prepared = time.monotonic()
            job = "commit-drive-scsi0"
            vm.qmp("block-commit", {"job-id": job, "device": disk.top_node,
                                    "top-node": disk.block_node,
                                    "base-node": vm.format_node_on(vg.lv_path(base))})
            clean = vm.run_job_to_completion(job, timeout=JOB_TIMEOUT)
            ended = time.monotonic()
        return JobRun(kind, ended - prepared, prepared - began, failed=not clean,
                      lv_after=vg.lv_size(base))
    finally:
        sh("lvremove", "-q", "-f", vg.lv_path(top), vg.lv_path(base), check=False)


def _mirror(vg: VG, volumes: VolumeCommands, kind: str, data: int, maximum: int) -> JobRun:
    """A running VM's disk moved onto the storage: a full mirror into a new
    volume, reduced when the VM has stopped."""
    source, target = "vm-9100-disk-0.qcow2", "vm-9100-disk-1.qcow2"
    _source(vg, source, data, 0x33)
    disk = Pve9Disk.for_volume(vg.lv_path(source), f"{STORE}:{source}")
    try:
        with QemuVM(VMID, volumes.run_dir, disks=[disk]) as vm:
            began = time.monotonic()
            _copy_target(vg, kind, target, maximum)
            prepared = time.monotonic()
            target_disk = Pve9Disk.for_volume(vg.lv_path(target), f"{STORE}:{target}",
                                              drive_id="scsi1")
            vm.qmp("blockdev-add", target_disk.format_blockdev())
            job = "mirror-drive-scsi0"
            # qemu-server's blockdev_mirror: below the throttle node, replacing the source.
            vm.qmp("blockdev-mirror", {"job-id": job, "device": disk.top_node,
                                       "target": target_disk.block_node, "sync": "full",
                                       "replaces": disk.block_node})
            clean = vm.run_job_to_completion(job, timeout=JOB_TIMEOUT)
            ended = time.monotonic()
        # The VM stopped: Proxmox deactivates its volumes, the plugin reduces the copy.
        reduce = volumes.reduce_copy(target) if kind == "pvestord" else 0.0
        return JobRun(kind, ended - prepared, prepared - began, failed=not clean,
                      lv_after=vg.lv_size(target), reduce=reduce)
    finally:
        sh("lvremove", "-q", "-f", vg.lv_path(source), vg.lv_path(target), check=False)


def _convert(vg: VG, volumes: VolumeCommands, kind: str, data: int, maximum: int) -> JobRun:
    """A stopped VM's disk moved, cloned or imported: ``qemu-img convert -n``
    into a new volume, reduced at the deactivation that ends the task."""
    source, target = "vm-9100-disk-0.qcow2", "vm-9101-disk-0.qcow2"
    _source(vg, source, data, 0x44)
    try:
        began = time.monotonic()
        _copy_target(vg, kind, target, maximum)
        prepared = time.monotonic()
        copied = subprocess.run(  # noqa: S603 - argument list
            ["qemu-img", "convert", "-n", "-f", "qcow2", "-O", "qcow2", "-t", "none",
             vg.lv_path(source), vg.lv_path(target)],
            capture_output=True, text=True, timeout=JOB_TIMEOUT, check=False)
        ended = time.monotonic()
        same = subprocess.run(  # noqa: S603 - argument list
            ["qemu-img", "compare", "-f", "qcow2", "-F", "qcow2",
             vg.lv_path(source), vg.lv_path(target)],
            capture_output=True, text=True, timeout=JOB_TIMEOUT, check=False)
        reduce = volumes.reduce_copy(target) if kind == "pvestord" else 0.0
        return JobRun(kind, ended - prepared, prepared - began,
                      failed=copied.returncode != 0 or same.returncode != 0,
                      lv_after=vg.lv_size(target), reduce=reduce)
    finally:
        sh("lvremove", "-q", "-f", vg.lv_path(source), vg.lv_path(target), check=False)


def _source(vg: VG, lv: str, data: int, pattern: int) -> None:
    """A disk as the daemon left it, ``data`` written at :data:`DATA_OFFSET`."""
    vg.create_lv(lv, data + INITIAL)
    create_qcow2(vg.lv_path(lv), DISK)
    qemu_io(vg.lv_path(lv), f"write -P {pattern:#x} {DATA_OFFSET} {data}")


def _copy_target(vg: VG, kind: str, lv: str, maximum: int) -> None:
    """The volume qemu-server allocates for a copy (``clone_disk``): the
    plugin's decision and tags on pvestord's side, Proxmox's ``lvm`` type's
    on the thick side."""
    if kind == "pvestord":
        plan = ask_plugin(vg, {"op": "alloc", "vmid": qcow2_disk_vmid(lv), "format": "qcow2",
                               "name": lv, "virtual_size": DISK, "backing": False,
                               "callers": ["PVE::QemuServer::clone_disk"]})
        vg.create_lv(lv, int(plan["lv_size"]))
        sh("lvchange", "-q", *(f"--addtag={tag}" for tag in plan["tags"]), vg.lv_path(lv))
        create_qcow2(vg.lv_path(lv), DISK, options=(f"preallocation={plan['preallocation']}",))
    else:
        vg.create_lv(lv, maximum)
        create_qcow2(vg.lv_path(lv), DISK, options=("preallocation=metadata",))


class VolumeCommands:
    """``pvestord volume`` as the plugin runs it, on a storage.cfg naming
    the bench's VG (there is no /etc/pve in the guest)."""

    def __init__(self, vg: VG, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.locks = run_dir / "locks"
        self.locks.mkdir(exist_ok=True)
        self.storage_cfg = run_dir / "storage.cfg"
        self.storage_cfg.write_text(
            f"pvestord: {STORE}\n\tvgname {vg.name}\n\tcontent images\n"
            f"\tsnapshot-as-volume-chain 1\n\tpvestord-chunksize {CHUNK // MiB}M\n"
            f"\tpvestord-chunk-percentage 0.5\n\tpvestord-initial-size {INITIAL // MiB}M\n")

    def reduce_copy(self, lv: str) -> float:
        """What the plugin's ``deactivate_volume`` runs; its seconds."""
        began = time.monotonic()
        subprocess.run(  # noqa: S603 - argument list
            [str(VENV_BIN / "pvestord"), "volume", "reduce-copy", "--storage-config",
             str(self.storage_cfg), "--lock-dir", str(self.locks), "--run-dir",
             str(self.run_dir), f"{STORE}:{lv}"],
            capture_output=True, text=True, timeout=PLUGIN_TIMEOUT, check=True)
        return time.monotonic() - began


def ask_plugin(vg: VG, request: dict[str, Any]) -> dict[str, Any]:
    """The plugin's decision, asked as the Perl side asks it."""
    request["storage"] = {"storeid": STORE, "vgname": vg.name, "shared": False,
                          "options": {"pvestord-chunksize": f"{CHUNK // MiB}M",
                                      "pvestord-initial-size": f"{INITIAL // MiB}M",
                                      "pvestord-chunk-percentage": "0.5"}}
    done = subprocess.run([str(VENV_BIN / "pvestord"), "plugin"],  # noqa: S603 - argument list
                          input=json.dumps(request), capture_output=True, text=True,
                          timeout=PLUGIN_TIMEOUT, check=True)
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def _grow(vg: VG, lv: str, plan: dict[str, Any]) -> None:
    if plan["extend"]:
        sh("lvextend", "-q", "--size", f"{int(plan['lv_size'])}b", vg.lv_path(lv))


def qemu_io(path: str, command: str) -> None:
    """``qemu-io -c command`` on the image at ``path``; a failed one raises."""
    image_io(path, command, timeout=QEMU_IO_TIMEOUT)


def figures(result: dict[str, Any] | None) -> list[Figure]:
    rows: list[Figure] = []
    for flow in FLOWS:
        sides = result.get(flow, {}) if result else {}
        times = {kind: sides.get(kind, {}).get("job_seconds", {}).get("p50") for kind in KINDS}
        after = {kind: sides.get(kind, {}).get("lv_after_bytes") for kind in KINDS}
        rows += [Figure("9 block jobs", f"{flow} into pvestord p50", times["pvestord"], "s"),
                 Figure("9 block jobs", f"{flow} into thick p50", times["thick"], "s"),
                 Figure("9 block jobs", f"{flow} speed pvestord/thick",
                        ratio(times["thick"], times["pvestord"]),
                        target=(">=", SPEED_TARGETS[flow]),
                        note="" if result is None else
                        f"{result['data_bytes'] // MiB} MiB, {result['rounds']} rounds in turn"),
                 Figure("9 block jobs", f"{flow} plugin preparation p50",
                        sides.get("pvestord", {}).get("prepare_seconds", {}).get("p50"), "s"),
                 Figure("9 block jobs", f"{flow} failed",
                        None if not sides else
                        float(sum(sides[kind]["failed"] for kind in KINDS)),
                        target=("<=", 0))]
        if flow != "commit":
            rows.append(Figure("9 block jobs", f"{flow} reduction p50",
                               sides.get("pvestord", {}).get("reduce_seconds", {}).get("p50"),
                               "s"))
        rows += [Figure("9 block jobs", f"{flow} LV after, {kind}",
                        None if after[kind] is None else after[kind] / MiB, "MiB")
                 for kind in KINDS]
    return rows
