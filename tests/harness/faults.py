"""Fault injection for the node tier's fault suite (tests/integration/node/test_faults.py).

Three tools, all acting on real processes from outside:

- :class:`LvmFaults`: the rules for ``tests/harness/lvm_faulty``, the stand-in
  for the ``lvm`` binary that pvestord runs when ``PVESTORD_LVM`` points at
  it (as ovirt-imageio lets its binaries be replaced). A rule makes one LVM
  subcommand sleep, fail or hang, before or after the real command; markers
  tell the test the moment a call started or the real command returned.
- :func:`kill_unit`: SIGKILL to a daemon, and optionally to the commands it
  had running (their own process groups), as a cgroup kill would; without
  them, as a crash of the daemon alone (the OOM killer picks one process)
  leaves its children running.
- :class:`FaultLog`: one JSON line per fault tried, with its outcome and
  recovery time, which ``docs/reliability.md`` is generated from
  (``python -m tests.harness.reliability``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tests.harness.daemons import Daemon

WRAPPER = Path(__file__).resolve().parent / "lvm_faulty"


class LvmFaults:
    """The rule folder of one ``lvm_faulty`` wrapper."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        real = shutil.which("lvm")
        if real is None:
            raise RuntimeError("no lvm binary on PATH")
        self.real = real

    def environment(self) -> dict[str, str]:
        """What pvestord's environment needs for its LVM calls to go through us."""
        return {"PVESTORD_LVM": str(WRAPPER), "PVESTORD_FAULT_DIR": str(self.folder),
                "PVESTORD_FAULT_REAL_LVM": self.real}

    def rule(self, subcommand: str, line: str) -> None:
        """``line``: ``before sleep N``, ``before fail STATUS``, ``before hang``,
        ``after sleep N``; replaces any rule for ``subcommand``."""
        (self.folder / subcommand).write_text(line + "\n")

    def clear(self, subcommand: str | None = None) -> None:
        names = [subcommand] if subcommand else [p.name for p in self.folder.iterdir()
                                                 if "." not in p.name]
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                (self.folder / name).unlink()

    def forget_calls(self) -> None:
        for marker in self.folder.glob("*.started"):
            marker.unlink()
        for marker in self.folder.glob("*.finished"):
            marker.unlink()

    def _pids(self, subcommand: str, what: str) -> list[int]:
        try:
            text = (self.folder / f"{subcommand}.{what}").read_text()
        except FileNotFoundError:
            return []
        return [int(pid) for pid in text.split()]

    def started(self, subcommand: str) -> list[int]:
        return self._pids(subcommand, "started")

    def finished(self, subcommand: str) -> list[int]:
        return self._pids(subcommand, "finished")

    def calls_naming(self, word: str) -> list[tuple[int, str]]:
        """Every call so far (wrapper pid, its arguments) whose arguments name
        ``word`` as a whole argument or its ``VG/`` tail: ``vg/vm-100-disk-0``
        names ``vm-100-disk-0``."""
        try:
            lines = (self.folder / "calls").read_text().splitlines()
        except FileNotFoundError:
            return []
        calls = []
        for line in lines:
            pid, _, arguments = line.partition(" ")
            if any(arg == word or arg.endswith("/" + word) for arg in arguments.split()):
                calls.append((int(pid), arguments))
        return calls

    def running(self, subcommand: str = "*") -> list[int]:
        """Wrapper pids of ``subcommand`` (default: any) that started and still run."""
        pids = []
        for marker in self.folder.glob(f"{subcommand}.started"):
            pids += [int(pid) for pid in marker.read_text().split() if alive(int(pid))]
        return pids


def alive(pid: int) -> bool:
    """Running, and not a zombie its parent has yet to reap."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        # Gone before the open, or between the open and the read (ESRCH):
        # seen once in CI, in the QEMU-killed test's wait for lvextend.
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def kill_unit(daemon: Daemon, *, with_children: bool = False) -> list[int]:
    """SIGKILL ``daemon``; ``with_children``: also every command it has running,
    with their own children, as a cgroup kill or the OOM killer's would.

    The daemon is stopped (SIGSTOP) first, so it cannot start a command
    between the look at its children and the kill. pvestord runs each command
    in a new session, so a child's process group is its pid. Returns the
    process groups killed.
    """
    killed = []
    pid = daemon.proc.pid
    with contextlib.suppress(ProcessLookupError):
        if with_children:
            os.kill(pid, signal.SIGSTOP)
            for child in children_of(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child, signal.SIGKILL)
                    killed.append(child)
        os.kill(pid, signal.SIGKILL)
    daemon.proc.wait(timeout=60)
    return killed


def children_of(pid: int) -> list[int]:
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[1]) == pid:  # fields: state, ppid, ...
            children.append(int(stat.parent.name))
    return children


@dataclass
class FaultRecord:
    """One fault tried: what, how, and what came of it."""

    fault: str          # the row's name in docs/reliability.md
    injection: str      # how exactly it was injected
    outcome: str        # what the invariants showed
    recovery_s: float | None  # from the end of the fault to everything settled
    test: str           # the test that tried it


class FaultLog:
    """Appends :class:`FaultRecord` lines to ``<dir>/faults.jsonl``."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "faults.jsonl"

    def record(self, record: FaultRecord) -> None:
        with self.path.open("a") as out:
            out.write(json.dumps(asdict(record)) + "\n")


class Stopwatch:
    """Seconds since construction, for recovery times recorded (never asserted)."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def __call__(self) -> float:
        return round(time.monotonic() - self.started, 2)
