"""The full-VG runbook's first step, tried (node guest).

docs/operations.md, "When the VG is full", tells an admin what to do when a
thin VG has no room left and its VMs pause. This test walks its first steps
on real LVM, real QEMU and the real daemons: two VMs whose guests write past
their LV's end on a VG with less free space than one chunk, so both pause on
ENOSPC and the daemon cannot give them room; what the runbook says to look
at shows why (the journal fields, ``pvestord status``); then the runbook's
step 1, a PV added with ``pvcreate`` and ``vgextend``, and nothing else: no
``qm resume``, no ``pvestord extend``, no daemon restart. Both VMs must run
again on their own, every byte their guests wrote must read back, and the
images must check clean.

Why the daemons run from the start (and not only once the VMs have paused,
as in test_enospc_guest.py's start reconcile): the runbook's situation is a
node where pvestord runs, tries, fails and retries with its backoff, and the
question is whether that loop alone picks up room added under it. Whatever
moment the daemon first tries (a threshold before the pause, the ENOSPC
after it), no extension can fit, so the order of events does not change the
outcome.

The VMs are test_enospc_guest.py's writer guests (a boot sector writing
through virtio-blk with ``werror=enospc``), their qcow2 filled by the harness
to ~1.7 MiB short of a 64 MiB LV, the guest's 3 MiB write then crossing the
end. 32 MiB chunks keep the VG small: what each paused VM needs (one chunk
past its allocation, ~36 MiB) is more than the two extents left free.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pvestord.engine.failures import BACKOFF_MAX
from pvestord.policy.sizes import align_up
from tests.harness.daemonlog import extensions, records
from tests.harness.daemons import VENV_BIN, Daemon, NodeBed, ThinStorageSpec, daemons
from tests.harness.enospcguest import (
    DAEMON_START_TIMEOUT,
    EXTENT,
    FINISH_TIMEOUT,
    GUEST_PATTERN,
    GUEST_WRITE,
    LV_SIZE,
    PREFILL,
    RESUME_TIMEOUT,
    allocation,
    assert_image_holds,
    device,
    run_guest_until_paused,
    writer_vm,
)
from tests.harness.lvmbed import VG, MiB, loop_vg, sh
from tests.harness.polling import wait_until
from tests.harness.qemu import QemuVM, pve9_disk
from tests.harness.writerguest import build_writer

CHUNK = 32 * MiB
#: Two 64 MiB LVs and the "other users'" thick LV fit with room to spare; the
#: filler then leaves exactly FREE_EXTENTS.
VG_SIZE = 256 * MiB
#: Left free on the full VG: some room, less than either VM needs.
FREE_EXTENTS = 2
#: The PV the runbook adds: room for both VMs' chunks at once.
NEW_PV = 256 * MiB
VMIDS = (951, 952)
#: From a logged failure to its retry: the backoff doubles up to BACKOFF_MAX.
RETRY_TIMEOUT = BACKOFF_MAX + 60.0
#: From the PV added to a VM's RESUME: at worst the VM's backoff had reached
#: its maximum, then one pass (QMP, lvextend, re-arm) under nested TCG.
RESUMED_TIMEOUT = BACKOFF_MAX + RESUME_TIMEOUT
CLI_TIMEOUT = 120.0


@pytest.fixture
def vg() -> Iterator[VG]:
    with loop_vg(VG_SIZE) as small:
        yield small


@pytest.fixture
def bed(vg: VG, tmp_path: Path, out_dir: Path) -> NodeBed:
    # pvestord-thin-reserve is left at one chunk: the reserve holds back
    # only an extension that would fit, so it plays no part on a VG this full.
    return NodeBed(tmp_path, [ThinStorageSpec("thin1", vg.name, chunksize="32M",
                                              initial_size="32M")], logs_dir=out_dir)


def fill_leaving(vg: VG, extents: int) -> None:
    """A thick LV, another user of the shared VG, taking all but ``extents``
    of its free space (inactive and not zeroed: nothing writes it)."""
    extent = vg.extent_size()
    take = vg.free() // extent - extents
    assert take > 0, vg.free()
    sh("lvcreate", "-q", "-an", "-Zn", "-l", str(take), "-n", "other-user", vg.name)
    assert vg.free() == extents * extent


def status(bed: NodeBed, status_file: Path) -> dict[str, Any]:
    """``pvestord status --json``, as the runbook has the admin read it."""
    done = subprocess.run(  # noqa: S603 - argument list
        [str(VENV_BIN / "pvestord"), "status", "--json", "--file", str(status_file)],
        capture_output=True, text=True, timeout=CLI_TIMEOUT, stdin=subprocess.DEVNULL,
        check=False)
    view: dict[str, Any] = json.loads(done.stdout) if done.stdout else {}
    return view


def drive_row(view: dict[str, Any], vmid: int, file_node: str) -> dict[str, Any] | None:
    return next((row for row in view.get("drives", [])
                 if row["vmid"] == vmid and row["block_node"] == file_node), None)


def shows_full(bed: NodeBed, status_file: Path, vg: VG, vms: list[QemuVM]) -> bool:
    """Whether ``status`` shows the VG critical and every VM's drive failed
    on the full VG (the reason is LVM's refusal)."""
    if not status_file.exists():
        return False
    view = status(bed, status_file)
    if view.get("vgs", {}).get(vg.name, {}).get("health") != "critical":
        return False
    rows = [drive_row(view, vm.vmid, pve9_disk(vm).file_block_node) for vm in vms]
    return all(row is not None and row["state"] == "failed"
               and "volume group is full" in str(row["reason"]) for row in rows)


def wait_blocked_and_retried(pvestord: Daemon, vm: QemuVM) -> None:
    """The journal says why ``vm`` stays paused, and the daemon keeps trying."""
    vmid, node = str(vm.vmid), pve9_disk(vm).file_block_node
    blocked = pvestord.wait_record(f"VM {vmid} said blocked", RETRY_TIMEOUT, "WARNING",
                                   VMID=vmid, RESUME_BLOCKED="drive-failed")
    assert blocked.fields["DEVICE"] == device(vm, "data0")["qdev"], blocked
    pvestord.wait_record(f"VM {vmid}'s full VG logged", RETRY_TIMEOUT, "ERROR",
                         VMID=vmid, BLOCK_NODE=node, FAILURE="vg-full")
    # A retry after the backoff, failing the same way: said at debug level only.
    pvestord.wait_record(f"VM {vmid}'s extension retried", RETRY_TIMEOUT, "DEBUG",
                         VMID=vmid, BLOCK_NODE=node, STILL_FAILING="yes")


@pytest.mark.node_full  # two guests and the daemon's backoff: minutes; test_engine.py's
# full-VG test and test_enospc_guest.py cover each half in the quick set
def test_a_full_vg_with_paused_vms_runs_again_once_a_pv_is_added(
        bed: NodeBed, vg: VG, tmp_path: Path, out_dir: Path) -> None:
    guests = [build_writer(tmp_path, out_dir, f"writer-{vmid}", start=PREFILL,
                           length=GUEST_WRITE, pattern=GUEST_PATTERN) for vmid in VMIDS]
    made = [writer_vm(bed, vg, vmid, guest) for vmid, guest in zip(VMIDS, guests, strict=True)]
    vms, lvs = [vm for vm, _, _ in made], [lv for _, lv, _ in made]
    # Full before the daemons start: their first capacity account sees it.
    fill_leaving(vg, FREE_EXTENTS)
    status_file = tmp_path / "run-pvestord" / "status.json"
    with daemons(bed, start_timeout=DAEMON_START_TIMEOUT,
                 pvestord_args=("--vg-health-dir", str(status_file.parent / "vg-unhealthy"))
                 ) as (qmeventd, pvestord), contextlib.ExitStack() as running:
        for vm in vms:
            running.enter_context(vm)
            # Connected before the guest runs, so the pause's event is queued.
            qmeventd.wait_record(f"VM {vm.vmid}'s QMP connection", 60, VMID=str(vm.vmid),
                                 QEMU_PID=str(vm.pid), QMP_SESSION="connected")
        for vm, guest in zip(vms, guests, strict=True):
            run_guest_until_paused(vm, guest)
        # Where each image ends now: the daemon's answer is one chunk past it.
        expected = [align_up(max(LV_SIZE, allocation(vm)) + CHUNK, EXTENT) for vm in vms]
        assert all(size - LV_SIZE > FREE_EXTENTS * EXTENT for size in expected), expected

        # What the runbook says to look at: the journal, then status.
        for vm in vms:
            wait_blocked_and_retried(pvestord, vm)
        pvestord.wait_record("the VG's critical level", RETRY_TIMEOUT, "WARNING",
                             VG=vg.name, CAPACITY_LEVEL="critical")
        wait_until(lambda: shows_full(bed, status_file, vg, vms), RETRY_TIMEOUT,
                   "status showing the VG critical and both drives failed")
        # Still paused, nothing grown, after a retry each.
        for vm, lv, guest in zip(vms, lvs, guests, strict=True):
            assert vm.qmp("query-status")["status"] == "io-error"
            assert vg.lv_size(lv) == LV_SIZE
            assert "S" not in guest.output()

        # The runbook's step 1: a PV added (pvcreate, vgextend), nothing else.
        vg.add_pv(NEW_PV)

        for vm, guest in zip(vms, guests, strict=True):
            vm.wait_event("RESUME", timeout=RESUMED_TIMEOUT)
            out = guest.wait_finished(FINISH_TIMEOUT)
            assert out == guest.success, out
            state = vm.qmp("query-status")
            assert (state["status"], state["running"]) == ("running", True), state
            pvestord.wait_record(f"VM {vm.vmid} resumed", 30, VMID=str(vm.vmid),
                                 RESUMED="nospace")
        assert [vg.lv_size(lv) for lv in lvs] == expected
        assert [vg.device_size(lv) for lv in lvs] == expected
        log = pvestord.log_text()
    for vm, lv, size in zip(vms, lvs, expected, strict=True):
        # One extension each: the retry that found the room, from 64 MiB.
        [grown] = extensions(log, VMID=str(vm.vmid))
        assert (grown.fields["LV"], int(grown.fields["OLD_SIZE"]),
                int(grown.fields["NEW_SIZE"])) == (lv, LV_SIZE, size), grown
        assert len(records(log, VMID=str(vm.vmid), RESUMED="nospace")) == 1
    # Once QEMU has quit: every byte the harness and the guests wrote, and clean images.
    for lv, guest in zip(lvs, guests, strict=True):
        assert_image_holds(vg, lv, guest, prefilled=PREFILL)
