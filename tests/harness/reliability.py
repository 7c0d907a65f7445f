"""docs/reliability.md, generated from the fault suite's results.

``make faults`` runs tests/integration/node/test_faults.py with every kill
moment; each fault tried leaves a record in ``faults.jsonl``. This module
copies those records to ``docs/reliability-results.jsonl`` and renders
``docs/reliability.md`` from them, so the table is what the suite measured,
never what someone remembered. tests/unit/test_reliability_doc.py checks that
the committed page is exactly the rendering of the committed results and
that every fault listed here has a test, so it cannot go stale quietly.

Usage::

    python -m tests.harness.reliability out/faults/faults.jsonl
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "reliability.md"
RESULTS = ROOT / "docs" / "reliability-results.jsonl"
SUITE = "tests/integration/node/test_faults.py"


@dataclass(frozen=True)
class Fault:
    """A row of the page: a fault to try, and the test that tries it."""

    name: str
    test: str            # "path::function"
    #: For a fault tried outside the fault suite: what that test shows.
    elsewhere: str = ""


FAULTS = [
    Fault("kill -9 pvestord during an extension",
          f"{SUITE}::test_pvestord_killed_at_every_moment_of_an_extension"),
    Fault("kill -9 qmeventd-py", f"{SUITE}::test_qmeventd_killed_while_a_threshold_is_crossed"),
    Fault("QEMU killed in the middle of an extension",
          f"{SUITE}::test_qemu_killed_in_the_middle_of_an_extension"),
    Fault("LVM command fails", f"{SUITE}::test_lvm_failing_hanging_and_slow"),
    Fault("LVM command hangs", f"{SUITE}::test_lvm_failing_hanging_and_slow"),
    Fault("LVM command slow", f"{SUITE}::test_lvm_failing_hanging_and_slow"),
    Fault("queue file holds garbage",
          f"{SUITE}::test_queue_file_garbage_deleted_truncated_and_symlinked"),
    Fault("queue file deleted",
          f"{SUITE}::test_queue_file_garbage_deleted_truncated_and_symlinked"),
    Fault("queue file truncated",
          f"{SUITE}::test_queue_file_garbage_deleted_truncated_and_symlinked"),
    Fault("queue file replaced by a symlink",
          f"{SUITE}::test_queue_file_garbage_deleted_truncated_and_symlinked"),
    Fault("storage lock holder killed", f"{SUITE}::test_storage_lock_holder_killed"),
    Fault("QMP socket accepts and never answers",
          f"{SUITE}::test_vm_whose_qmp_socket_never_answers"),
    Fault("qmeventd-py killed while events arrive",
          "tests/integration/host/test_qmeventd.py::"
          "test_daemon_killed_and_restarted_loses_nothing",
          "30 QEMUs' events queued, SIGKILL, restart: every QEMU reconnects and every "
          "event that reached the queue before the kill is still there, once"),
    Fault("VM stopped by the user while its entry is queued",
          "tests/integration/node/test_engine.py::test_vm_paused_by_the_user_is_never_resumed",
          "the entry is handled and dropped; a VM the user paused is never resumed"),
    Fault("VM paused on ENOSPC, daemon not running",
          "tests/integration/node/test_enospc_guest.py::"
          "test_start_reconcile_resumes_a_vm_paused_on_enospc",
          "a real guest's write paused the VM; the daemon's start reconcile extended the LV "
          "and resumed it; the guest's write completed and reads back"),
    Fault("VG full, then space added",
          "tests/integration/node/test_engine.py::"
          "test_full_vg_keeps_the_entry_then_extends_when_space_is_added",
          "the error is logged once, the entry kept; after vgextend the LV grows and "
          "writes continue"),
    Fault("VG full with two VMs paused on ENOSPC, a PV added (the runbook's step 1)",
          "tests/integration/node/test_full_vg_runbook.py::"
          "test_a_full_vg_with_paused_vms_runs_again_once_a_pv_is_added",
          "two guests paused past their 64 MiB LVs on a VG with 8 MiB free (chunk 32 MiB); "
          "each logged FAILURE=vg-full, RESUME_BLOCKED=drive-failed and a retry, status "
          "showed the VG critical and both drives failed; pvcreate + vgextend and no other "
          "command: both resumed by the daemon's retry, one extension each, every byte "
          "read back, qemu-img check clean (docs/operations.md, When the VG is full)"),
    Fault("hostile queue lines, storage.cfg text, QMP replies and events",
          "tests/unit/test_fuzz_queue.py, test_fuzz_config.py, test_fuzz_qmp.py",
          "hypothesis: parsers return a result or their own error type, good entries "
          "survive any garbage, and every error a parser raises is one the daemon's "
          "per-VM pass handles"),
    Fault("device-mapper table smaller than the LV's metadata (stale after a migration)",
          "tests/integration/node/test_faults_engine.py::"
          "test_table_smaller_than_the_metadata_is_refreshed_before_anything_is_armed",
          "metadata 128 MiB, table reloaded to 64 MiB, 80 MiB written: QEMU read zeros past "
          "64 MiB; the first reconcile refreshed the table (64 -> 128 MiB) before arming, "
          "then armed at 96 MiB; no lvextend; every byte read back"),
    Fault("device-mapper table larger than the LV's metadata (lost extension)",
          "tests/integration/node/test_faults_engine.py::"
          "test_table_larger_than_the_metadata_is_never_extended_over",
          "table 128 MiB, metadata 64 MiB, 80 MiB written: 5 refusals logged (TABLE=ahead, "
          "one at ERROR), a threshold entry left queued, LV still 64 MiB, no lvextend, "
          "`drives` state failed, every byte read back"),
    Fault("VM paused with a non-thin device out of space and a sticky nospace thin drive",
          "tests/integration/node/test_faults_engine.py::"
          "test_a_vm_whose_resume_is_blocked_gets_one_extension_per_new_enospc",
          "real guest: thin ENOSPC answered 64 -> 324 MiB and resumed; rebooted into a "
          "write past a 16 MiB non-thin LV: both devices nospace; over 7 blocked passes "
          "(3 s reconciles) the thin LV stayed 324 MiB, VM kept paused, each pass logged "
          "RESUME_BLOCKED=not-thin with the device (WARNING first, then DEBUG); a restarted "
          "daemon gave it one chunk (580 MiB) and no more"),
    Fault("pvestord extend or a manual entry naming no thin drive",
          "tests/integration/node/test_faults_engine.py::"
          "test_extend_with_a_wrong_name_touches_no_drive",
          "`extend` with a typo, a non-thin format node and its file node: exit 1 each, "
          "both thin LVs still 64 MiB; manual entries for both handled and dropped, nothing "
          "extended; the right name then extended 64 -> 128 MiB"),
    Fault("volume shrink of a VM running on another node, its .rrd line gone",
          "tests/unit/test_volumes.py::"
          "test_vm_owned_by_another_node_is_refused_whatever_rrd_says",
          ".vmlist naming another node refuses with the .rrd line absent, stale (2023) or "
          "fresh and 'stopped' (4 cases), as does no quorum in .members; only the owner, "
          "quorate, with no local QEMU, may shrink (hypothesis over owner, quorum, status, "
          "age); the node guest's shrink refusal test does the same with real LVM, the VG "
          "metadata unchanged"),
    Fault("pmxcfs hangs while qmeventd-py appends to the queue",
          "tests/integration/host/test_qmeventd.py::"
          "test_hung_queue_folder_never_holds_up_shutdown_and_cleanup",
          "the queue on a bindfs FUSE mount whose server is SIGSTOPped: the append waits "
          "in a thread (seen in /proc wchan request_wait_answer); meanwhile another QEMU's "
          "SHUTDOWN got SIGTERM and 'qm cleanup' (the recorder) ran, and a second event was "
          "taken; after SIGCONT both entries landed once (n=1 each); 1.2 s for the test. "
          "Before the change the loop itself blocked: the QEMU was not terminated in 30 s"),
    Fault("queue lock held by another process past qmeventd-py's lock timeout",
          "tests/integration/host/test_qmeventd.py::"
          "test_queue_lock_held_past_its_timeout_loses_nothing",
          "the append gives up the lock after its 10 s timeout and is retried; the entry "
          "lands once the lock is free, and later events still merge (11.3 s). Before the "
          "change the LockTimeout ended the appender task: nothing was queued after it"),
    Fault("a shared VG's LVM metadata area running full",
          "tests/integration/node/test_faults_metadata.py::"
          "test_metadata_running_low_is_warned_once_per_crossing",
          "32 KiB metadata area (13824 bytes of room with two LVs), one-extent extensions "
          "in turn: 107.5 bytes of room each; after 100 extensions (3072 bytes left) the "
          "running pvestord warned once with VG, MDA_FREE, MDA_SIZE, not again while it "
          "fell further; removing an LV gave one all-clear (8192 bytes), and 40 more "
          "extensions one new warning"),
    Fault("package installed beside an enabled, unmasked qmeventd",
          "tests/packaging/test_systemd_boot.py::"
          "test_no_two_units_fight_for_the_event_socket_at_boot",
          "Debian 12 booted with systemd as PID 1, a stand-in qmeventd.service enabled "
          "before dpkg -i: the postinst left qmeventd-py disabled, the boot started "
          "qmeventd alone (no conflicting job); 'systemctl mask --now qmeventd' and "
          "'systemctl enable --now qmeventd-py' switched in 0.8 s and a thin disk grew "
          "(guest run 172 s); test_install.py runs the purge/install/upgrade cases"),
    Fault("a killed command's descendant keeps its pipes",
          "tests/unit/test_command_kill.py::"
          "test_a_descendant_holding_the_pipes_after_sigkill_is_not_waited_for",
          "a command (timeout 1 s) whose descendant left its process group with setsid and "
          "held stdout/stderr: UnkillableCommandError naming the descendant's pid after "
          "6.2 s (1 s + the 5 s kill wait); the old code waited for the pipes without end "
          "(still waiting when the test's 16 s bound cut it)"),
    Fault("an lvm that SIGKILL does not end (D state)",
          "tests/unit/test_command_kill.py::test_a_process_sigkill_does_not_end_is_not_waited_for"
          ", test_lvmshell.py::test_a_shell_sigkill_does_not_end_is_not_waited_for",
          "a plain command and a persistent lvm shell whose SIGKILL has no effect (D state "
          "cannot be made here: the kill is replaced by one that does nothing): the wait "
          "ends after 1 s + 5 s with UnkillableCommandError naming the process's pid"),
    Fault("storage lock held longer than its lifetime",
          "tests/unit/test_lock_renewal.py::"
          "test_another_process_never_enters_while_the_holder_renews",
          "a lock directory with a 1.5 s lifetime, renewed every 0.375 s while held: a "
          "second process waiting 6 s on it with the same emulated expiry timed out (6.6 s "
          "test); without renewal the same waiter expired it and got in "
          "(test_an_unrenewed_lock_is_expired_by_the_same_waiter)"),
    Fault("Proxmox holds the lock of a thick storage on the same VG",
          "tests/unit/test_lock_renewal.py::"
          "test_a_thick_storage_lock_on_the_vg_blocks_the_thin_extension",
          "another process holding storage-thick1 (as Proxmox's lvcreate would) made the "
          "extension lock of thin1 on the same VG time out naming storage-thick1; after its "
          "release both locks were taken, in sorted order; a disabled storage's was not"),
    Fault("lvm that SIGKILL does not end (D state), slower than the lock's lifetime",
          "tests/integration/node/test_faults_lock.py::"
          "test_an_lvm_sigkill_does_not_end_keeps_the_lock_and_marks_the_vg",
          "node guest, lock lifetime 45 s, --lvm-timeout 20: the lvextend timed out at 20 s; "
          "5 s after SIGKILL the pass ended with the error naming the 2 pids left and the VG "
          "was marked; the lock stayed, renewed, for 100.5 s (121 s in an earlier run) until "
          "the stuck process ran its late lvextend and ended 71 s after the kill; a second "
          "process waiting with the same expiry got in only then (more than one lifetime "
          "later, stuck process gone); the other VG's LV was extended meanwhile (11.5 s)"),
    Fault("change on a VG marked unhealthy",
          "tests/integration/node/test_faults_lock.py::"
          "test_an_lvm_sigkill_does_not_end_keeps_the_lock_and_marks_the_vg",
          "every later pass on the marked VG was refused before any LVM command (no "
          "lvextend started), its entry kept queued; the drive stays un-re-armed until the "
          "mark is removed (the refusal comes before the LV is read again)"),
    Fault("lvm slower than the storage lock's lifetime",
          "tests/integration/node/test_faults_lock.py::"
          "test_an_lvm_slower_than_the_lock_is_killed_before_the_lock_could_expire",
          "node guest: every lvextend of the VG slept 90 s (lock lifetime 45 s, "
          "--lvm-timeout 20): killed at 20 s, inside the lock's guaranteed life; a second "
          "process waiting on the lock got in only when no lvextend ran; the VG was not "
          "marked; extended 32 s after the rule was removed; no write failed"),
    Fault("left-over outgoing migration mark, VM paused on ENOSPC",
          "tests/integration/node/test_faults_daemon.py::"
          "test_leftover_migration_mark_does_not_keep_a_vm_paused",
          "a real guest paused on ENOSPC under a mark with no migration: while the mark "
          "was fresh the extension was deferred and the paused VM said once at warning "
          "(8 QMP connections over the retries); once the mark was past its 60 s grace, "
          "the first pass removed it (warning, VMID), extended 64 -> 324 MiB and resumed "
          "the VM: 33 s from aging the mark to RESUME under nested TCG, 21 s of it the "
          "extension's own lock and LVM time. Before the mark had a grace (not re-run): "
          "deferred 3600 s, "
          "logged at DEBUG only"),
    Fault("busy loop while a VM migrates",
          "tests/integration/host/test_busy_vm.py::test_incoming_vm_is_retried_with_backoff, "
          "tests/integration/host/test_busy_vm.py::"
          "test_migrating_source_is_retried_with_backoff, "
          "tests/integration/node/test_faults_daemon.py::"
          "test_incoming_vm_is_retried_with_backoff_and_refreshed_once, "
          "tests/integration/node/test_faults_daemon.py::"
          "test_migrating_source_is_retried_with_backoff",
          "QMP connections pvestord made in 10 s, counted by a proxy on the VM's socket: "
          "host tier, QEMU in inmigrate 1144 before, 4 after; source of a real migration "
          "in flight 1694 before, 4 after. Node tier (thin drive, LVM counted through "
          "lvm_faulty), after: inmigrate 1 QMP connection, 3 LVM processes and 1 refresh "
          "for one table change; source 3 QMP connections, 0 LVM processes, LV not grown"),
    Fault("pass that never ends (hung lvm, QMP peer that never greets)",
          "tests/integration/node/test_faults_daemon.py::"
          "test_stuck_pass_is_abandoned_and_other_vgs_are_served, "
          "tests/unit/test_daemon_watchdog.py::"
          "test_a_pass_past_its_deadline_is_abandoned_and_the_daemon_goes_on",
          "--pass-deadline 60 in the node guest: the pass stuck in lvextend (killable) "
          "abandoned at its deadline, logged at error with VMID and VG, its VG marked 56 s "
          "after the lvextend started, the cancellation done 0.1 s later; a VM on another "
          "VG then extended (10.4 s of LVM), that VG not marked; a QMP peer that never "
          "greets abandoned at each deadline, no VG marked; the watchdog fed throughout "
          "(293 pings at 1 s). An lvm in D state (O_DIRECT read of a suspended dm device) "
          "stopped the pings 31 s after its cancel in two earlier runs; that variant is not "
          "kept, as the test blocked after its dmsetup resume"),
    Fault("a storage-plugin call outlasting Proxmox's storage lock alarm",
          "tests/proxmox/test_plugin_lock.py::"
          "test_plugin_call_under_the_lock_is_aborted_by_its_alarm, "
          "tests/proxmox/test_plugin_lock.py::test_stand_in_lock_keeps_cfs_locks_contract",
          "through the real PVE::Storage with a stand-in cfs_lock_storage that keeps "
          "cfs_lock's contract (a 60 s alarm armed for the locked code, the caller's own "
          "alarm given back after it): a volume_resize whose pvestord answer started 5 s "
          "late under a 2 s alarm died with \"'storage-thin1'-locked command timed out - "
          "aborting\" before pvestord ran; the plugin never suspends the alarm, so no LVM "
          "change can outlive the lock"),
    Fault("a VM paused on ENOSPC while another of its drives may not be grown now",
          "tests/unit/test_resume_with_held_drive.py::"
          "test_a_drive_the_pass_may_not_grow_does_not_keep_the_vm_paused",
          "the drive that paused the VM grown, another drive past its threshold held back "
          "(the VG's reserve, or a snapshot lock): the VM is resumed at once, nothing armed "
          "on the held drive; a drive the pass may still grow gets another round first "
          "(test_a_drive_the_pass_may_grow_gets_another_round_first)"),
    Fault("a pass that waits for the storage lock past its deadline",
          "tests/unit/test_pass_deadline_marks.py::"
          "test_a_pass_that_waits_for_the_storage_lock_is_in_no_lvm_change",
          "the real daemon's extension waiting for a lock a second process holds (as "
          "another node would): the status shows the drive being extended, the pass is "
          "in no LVM change, and no VG is marked unhealthy; only a running LVM change "
          "marks its VG"),
    Fault("'lock: migrate' through an hours-long local-disk mirror",
          "tests/unit/test_migrate_lock_activity.py::"
          "test_eleven_minutes_into_a_local_disk_mirror_the_lock_still_defers, "
          "tests/unit/test_migrate_lock_mirror.py::"
          "test_the_source_defers_while_it_mirrors_into_the_targets_nbd_export, "
          "tests/integration/cluster/test_migrate_lock_mirror.py::"
          "test_lock_migrate_defers_through_a_local_disk_mirror",
          "a config written 11 minutes before (past the 600 s grace) keeps deferring while "
          "the source QEMU mirrors into the target's NBD export or qemu-server's migration "
          "task still runs; two real nodes: a chunk committed during the mirror reached "
          "B's table while it was inmigrate, A deferred twice. The two-node test also "
          "passed on the code before this rule, so the unit tests are the evidence"),
    Fault("a rollback refused for room, or failing half-way",
          "tests/proxmox/test_rollback.py::test_capacity_refusal_leaves_the_volume_as_it_was, "
          "tests/integration/node/test_proxmox_plugin.py::"
          "test_rollback_refused_for_room_leaves_the_volume_as_it_was",
          "the real PVE::Storage: a VG with 1.6 GiB free, a snapshot, a rollback refused by "
          "the capacity guard before anything changed; a failure after the old top was "
          "renamed undone (new top removed, old renamed back): the volume keeps its current "
          "LV with the guest's data, and the retry after room was freed completes; real "
          "LVM in the node guest shows the same; with saferemove the old top is zeroed by "
          "Proxmox's worker after the storage lock is released"),
    Fault("pvestord restarted while an lvm it killed is stuck (custody of the lock)",
          "tests/integration/node/test_faults_lock.py::"
          "test_custody_of_a_stuck_lvm_survives_a_pvestord_restart, "
          "tests/unit/test_custody_restart.py::"
          "test_the_lock_of_a_stuck_command_stays_held_across_a_daemon_restart",
          "the stuck process and its lock directory are recorded under /run/pvestord; the "
          "next daemon adopts that same lock directory and renews it until the process "
          "ends, so a waiter with the same expiry never got in meanwhile; a reused pid "
          "and a lock taken by another while no daemon ran are not adopted. On the old "
          "code nothing renewed the lock after the stop and the waiter got in"),
    Fault("an LV left suspended by a change killed between suspend and resume",
          "tests/integration/node/test_faults_suspend.py::"
          "test_an_lv_left_suspended_by_a_killed_lvextend_is_resumed",
          "lvm_faulty hangs the lvextend after its suspend and the daemon's kill ends it "
          "there: the LV is found suspended from sysfs at once, its inactive table "
          "cleared (never a resume of a table the metadata does not hold), then "
          "lvchange --refresh; the table is not larger than the metadata and the guest's "
          "next write goes through"),
    Fault("a snapshot-delete lock left behind by a failed task",
          "tests/unit/test_leftover_renaming_lock.py::"
          "test_a_left_over_snapshot_delete_lock_stops_refusing_extensions",
          "the daemon stands back while the lock is fresh or a block job runs; once it has "
          "sat 600 s with no job in the VM's QEMU, threshold events extend the drive again "
          "and the lock is said at warning once, with 'qm unlock'"),
    Fault("a snapshot delete's job the storage plugin did not prepare",
          "tests/unit/test_pass_notices.py::"
          "test_a_snapshot_delete_job_the_plugin_did_not_prepare_is_said_once, "
          "tests/integration/node/test_proxmox_plugin.py::"
          "test_a_live_delete_reading_the_chain_in_an_eval_is_prepared_and_recorded, "
          "tests/proxmox/test_qemu_server_calls.py::"
          "test_an_online_snapshot_delete_reads_the_chain_right_before_its_job",
          "a commit under 'lock: snapshot-delete' with no record of the plugin's "
          "preparation newer than the lock: one warning (UNPREPARED_JOB, VG, LV), then "
          "debug; the target is still grown behind the job; with the record, nothing "
          "said. The plugin recognises the call through eval blocks, and the qemu-server "
          "calls it reads are pinned against a qemu-server archive (9.2.6)"),
    Fault("max-overcommit judged on a node where other nodes' LVs are inactive",
          "tests/proxmox/test_capacity_tags.py::"
          "test_max_overcommit_counts_an_lv_inactive_here_at_its_recorded_maximum",
          "each LV records its maximum in a tag (pvestord-max-<bytes>) under the storage "
          "lock; an LV inactive on this node counts at its recorded maximum, so every node "
          "judges the same commitment without measuring images under the lock"),
    Fault("a thin change while Proxmox changes a thick storage on the same VG",
          "tests/proxmox/test_vg_locks.py::"
          "test_a_thin_alloc_waits_for_proxmoxs_thick_operation_on_the_vg",
          "the plugin takes every storage lock of the VG in the daemon's sorted order: a "
          "thin alloc waited for the lock Proxmox held for a thick storage on the VG, and "
          "its lvcreate ran only after; a VG marked unhealthy on this node is refused "
          "before the locks and again under them"),
    Fault("a VM writing another VM's disk",
          "tests/unit/test_pass_notices.py::"
          "test_another_vms_disk_attached_to_a_vm_is_grown_and_said_once",
          "the disk is grown as the VM's own (it would pause otherwise) and the first pass "
          "says so at info with the VM, the LV and its owner (OWNER); later passes at "
          "debug"),
]


@dataclass(frozen=True)
class Result:
    fault: str
    injection: str
    outcome: str
    recovery_s: float | None
    test: str


def load(path: Path) -> list[Result]:
    return [Result(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


INTRO = """\
# Reliability: faults tried and what came of them

<!-- Generated by `python -m tests.harness.reliability` from the fault suite's
results (`make faults`, saved in docs/reliability-results.jsonl). Do not edit:
tests/unit/test_reliability_doc.py fails when this page is not exactly that
rendering, or when a fault here has no test. -->

The fault suite (`tests/integration/node/test_faults.py`) runs both daemons as
real processes in the node guest, with a real QEMU writing through its qcow2
node on a real LV, and injects each fault from outside: `kill -9`, `SIGSTOP`,
a stand-in for the `lvm` binary (`tests/harness/lvm_faulty`, through
`PVESTORD_LVM`) that fails, hangs or dawdles on request, and direct abuse of
the queue file and the lock directory. A crashed daemon is started again by
the test, as systemd's `Restart=on-failure` does.

After every fault these invariants are checked:

- every byte the workload wrote reads back, and none of its writes failed;
- the VM runs: nothing paused it and nothing left it paused;
- the LV grew exactly one chunk per crossed threshold (never twice), within
  the maximum `qemu-img measure` allows;
- the threshold is re-armed for the new size; the queue parses and holds no
  entry for work already done;
- `qemu-img check` is clean at the end; the daemon is running and logged the
  fault's error once.

*Recovery* is the time from the end of the fault (the restart, the rule
removed, the process continued) to all of the above holding again, on this
emulated node (TCG inside TCG, where one extension takes 2-5 s and a daemon's
Python start-up several seconds). It is measured, not asserted.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(results: Sequence[Result]) -> str:
    lines = [INTRO]
    names = {f.name for f in FAULTS}
    unknown = sorted({r.fault for r in results} - names)
    if unknown:
        raise ValueError(f"results for faults not listed in FAULTS: {unknown}")
    suite = [f for f in FAULTS if not f.elsewhere]
    recoveries = [r.recovery_s for r in results if r.recovery_s is not None]
    lines.append(f"## The fault suite: {len(results)} faults tried\n")
    if recoveries:
        lines.append(
            f"Recovery over all of them: median {statistics.median(recoveries):.1f} s, "
            f"longest {max(recoveries):.1f} s. That is the bound on how long a guest that "
            "kept writing meanwhile could have stayed paused (with `werror=enospc`, as "
            "test_enospc_guest.py shows, it pauses instead of failing, and the recovery "
            "resumes it). The storage lock case is bounded by pmxcfs's 120 s lock expiry "
            "instead; the test backdates the dead holder's lock.\n")
    for fault in suite:
        rows = [r for r in results if r.fault == fault.name]
        test = fault.test.split("::")[1]
        lines.append(f"### {fault.name}\n")
        lines.append(f"Test: `{test}`\n")
        if not rows:
            lines.append("Not tried in the recorded run.\n")
            continue
        lines.append("| Injection | Outcome | Recovery (s) |")
        lines.append("|---|---|---|")
        for r in rows:
            recovery = "-" if r.recovery_s is None else f"{r.recovery_s:.1f}"
            lines.append(f"| {_cell(r.injection)} | {_cell(r.outcome)} | {recovery} |")
        lines.append("")
    lines.append("## Faults tried by other tests\n")
    lines.append("| Fault | Test | What it shows |")
    lines.append("|---|---|---|")
    for fault in FAULTS:
        if fault.elsewhere:
            lines.append(f"| {_cell(fault.name)} | `{fault.test}` | {_cell(fault.elsewhere)} |")
    lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="reliability", description="Render docs/reliability.md from the fault suite's "
        "results (faults.jsonl) and keep a copy of them in docs/reliability-results.jsonl.")
    parser.add_argument("results", type=Path, help="faults.jsonl written by the fault suite")
    args = parser.parse_args(argv)
    text = render(load(args.results))
    if args.results.resolve() != RESULTS:
        shutil.copyfile(args.results, RESULTS)
    DOC.write_text(text)
    print(f"wrote {DOC} from {len(load(RESULTS))} results")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
