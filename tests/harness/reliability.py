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
    """A row of the page: a fault issue 9 lists, and the test that tries it."""

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
    Fault("hostile queue lines, storage.cfg text, QMP replies and events",
          "tests/unit/test_fuzz_queue.py, test_fuzz_config.py, test_fuzz_qmp.py",
          "hypothesis: parsers return a result or their own error type, good entries "
          "survive any garbage, and every error a parser raises is one the daemon's "
          "per-VM pass handles"),
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
