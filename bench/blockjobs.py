"""Scenario 9: block jobs into a pvestord volume against the same job into a thick LV.

A running VM's snapshot delete and a live move disk are QEMU block jobs that
write at the node's full speed, and qemu-server gives them no ``on-error``:
the first ENOSPC fails the job. pvestord's storage plugin therefore makes
their room before they start (packaging/perl, pvestord/features/plugin.py):

- **commit**: deleting a running VM's first snapshot is an active
  ``block-commit`` of the disk into the snapshot's LV. On a pvestord storage
  that LV is small; the plugin grows it by the source's LV plus a chunk when
  qemu-server reads the chain right before the job. Against: the same LV at
  the image's maximum, as Proxmox's own ``lvm`` type leaves it, with
  ``preallocation=metadata``.
- **mirror**: a move disk onto the storage is a ``blockdev-mirror`` into a
  volume the plugin allocates for a copy: an LV at the maximum and a qcow2
  without preallocation. Against: Proxmox's ``lvm`` type's volume, the same
  LV with ``preallocation=metadata``.

Each round sets up both sides alike (the same source data, written before
the clock starts) and runs them in turn, pvestord's side first in odd
rounds and second in even ones, so that a change of load hits both. The
job's time runs from the QMP command to ``BLOCK_JOB_COMPLETED``; the plugin's
own preparation (its decision as ``pvestord plugin`` and the ``lvextend``),
which qemu-server's task runs before the job, is reported beside it. The
figure is the speed ratio, thick job time over pvestord job time (target
at least 0.9), and the count of failed jobs and job errors (target 0).
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.report import Figure, ratio, summary
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
#: The target of the speed ratio (thick time over pvestord's time).
SPEED_TARGET = 0.9
KINDS = ("pvestord", "thick")


@dataclass(frozen=True)
class JobRun:
    kind: str
    #: Seconds from the job's QMP command to BLOCK_JOB_COMPLETED.
    job: float
    #: Seconds of the plugin's preparation before the job (0 for thick).
    prepare: float
    #: The job failed, or QEMU reported a job error on the way.
    failed: bool


def run(rounds: int, data: int) -> dict[str, Any]:
    """``rounds`` rounds of both jobs on both sides, ``data`` bytes copied each."""
    runs: dict[str, list[JobRun]] = {"commit": [], "mirror": []}
    # QMP sockets cannot live on the guest's shared result folder.
    run_dir = scratch_dir() / "blockjobs"
    run_dir.mkdir(parents=True, exist_ok=True)
    with loop_vg(2 * len(KINDS) * (DISK + GiB), prefix="pvb") as vg:
        maximum = measured_maximum(DISK, vg.extent_size())
        for round_no in range(rounds):
            order = KINDS if round_no % 2 == 0 else KINDS[::-1]
            for kind in order:
                runs["commit"].append(_commit(vg, run_dir, kind, data, maximum))
                runs["mirror"].append(_mirror(vg, run_dir, kind, data, maximum))
    result: dict[str, Any] = {"rounds": rounds, "data_bytes": data, "interleaved": True}
    for job, done in runs.items():
        result[job] = {kind: {"job_seconds": summary([r.job for r in done if r.kind == kind]),
                              "prepare_seconds": summary([r.prepare for r in done
                                                          if r.kind == kind]),
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
                _grow(vg, base, _plugin(vg, {"op": "commit", "target_lv": base,
                                             "source_lv": top, "virtual_size": DISK,
                                             "running": True}))
            prepared = time.monotonic()
            job = "commit-drive-scsi0"
            vm.qmp("block-commit", {"job-id": job, "device": disk.top_node,
                                    "top-node": disk.block_node,
                                    "base-node": vm.format_node_on(vg.lv_path(base))})
            clean = vm.run_job_to_completion(job, timeout=JOB_TIMEOUT)
            ended = time.monotonic()
        return JobRun(kind, ended - prepared, prepared - began, failed=not clean)
    finally:
        sh("lvremove", "-q", "-f", vg.lv_path(top), vg.lv_path(base), check=False)


def _mirror(vg: VG, run_dir: Path, kind: str, data: int, maximum: int) -> JobRun:
    """A running VM's disk moved onto the storage: a full mirror into a new volume."""
    source, target = "vm-9100-disk-0.qcow2", "vm-9100-disk-1.qcow2"
    vg.create_lv(source, data + INITIAL)
    create_qcow2(vg.lv_path(source), DISK)
    qemu_io(vg.lv_path(source), f"write -P 0x33 {DATA_OFFSET} {data}")
    disk = Pve9Disk.for_volume(vg.lv_path(source), f"{STORE}:{source}")
    try:
        with QemuVM(VMID, run_dir, disks=[disk]) as vm:
            began = time.monotonic()
            if kind == "pvestord":
                # qemu-server's clone_disk allocates the target: a copy flow.
                plan = _plugin(vg, {"op": "alloc", "virtual_size": DISK, "backing": False,
                                    "callers": ["PVE::QemuServer::clone_disk"]})
                vg.create_lv(target, int(plan["lv_size"]))
                create_qcow2(vg.lv_path(target), DISK,
                             options=(f"preallocation={plan['preallocation']}",))
            else:
                vg.create_lv(target, maximum)
                create_qcow2(vg.lv_path(target), DISK, options=("preallocation=metadata",))
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
        return JobRun(kind, ended - prepared, prepared - began, failed=not clean)
    finally:
        sh("lvremove", "-q", "-f", vg.lv_path(source), vg.lv_path(target), check=False)


def _plugin(vg: VG, request: dict[str, Any]) -> dict[str, Any]:
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
    for job in ("commit", "mirror"):
        sides = result[job] if result else {}
        times = {kind: sides.get(kind, {}).get("job_seconds", {}).get("p50") for kind in KINDS}
        rows += [Figure("9 block jobs", f"{job} into pvestord p50", times["pvestord"], "s"),
                 Figure("9 block jobs", f"{job} into thick p50", times["thick"], "s"),
                 Figure("9 block jobs", f"{job} speed pvestord/thick",
                        ratio(times["thick"], times["pvestord"]), target=(">=", SPEED_TARGET),
                        note="" if result is None else
                        f"{result['data_bytes'] // MiB} MiB, {result['rounds']} rounds in turn"),
                 Figure("9 block jobs", f"{job} plugin preparation p50",
                        sides.get("pvestord", {}).get("prepare_seconds", {}).get("p50"), "s"),
                 Figure("9 block jobs", f"{job} failed jobs",
                        None if result is None else
                        float(sum(sides[kind]["failed"] for kind in KINDS)),
                        target=("<=", 0))]
    return rows

