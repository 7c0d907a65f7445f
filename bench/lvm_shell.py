"""Scenario 4: a persistent ``lvm`` process against one ``lvm`` command per call.

LVM's start-up dominates an ``lvextend`` under emulation (docs/design.md, "LVM").
``lvm`` with no arguments is a shell that reads commands on stdin and keeps
its configuration and library state between them; lvmdbusd keeps one
running for the same reason, and so does pvestord (:mod:`pvestord.adapters.lvmshell`).
Both sides here are pvestord's own calls (:func:`pvestord.adapters.lvm.lv_info`,
:func:`pvestord.adapters.lvm.extend`, with pvestord's ``--config``): the plain side
as one process per command, the shell side through
:class:`pvestord.adapters.lvmshell.LvmShells`. Rounds interleave the two, on two LVs
of one VG, so both see the same load. After every round the LVs' sizes are
checked in LVM and in device-mapper.

:class:`LvmShell` below is the fleet's set-up helper (bench/drives.py): a
blocking shell for ``lvcreate``, which pvestord's shells do not run.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import queue
import subprocess
import threading
import time
from typing import Any

from bench.report import summary
from pvestord.adapters import lvm
from pvestord.adapters.command import binary
from pvestord.adapters.lvmshell import LvmShells
from tests.harness.lvmbed import MiB, loop_vg, sh

#: Budget for one command in the shell (as pvestord.adapters.lvm.CHANGE_TIMEOUT).
COMMAND_TIMEOUT = 40.0
STEP = 4 * MiB


class LvmShellError(Exception):
    """The shell printed something other than our marker, died, or overran."""


class LvmShell:
    """One ``lvm`` shell; :meth:`run` sends a command line and waits until it is done.

    The shell prints no prompt when stdin is not a terminal, so each command
    is followed by an unknown command name: LVM answers ``No such command
    '<marker>'`` once the real command finished, and every line before that
    is the command's output (stderr is merged into stdout).
    """

    def __init__(self) -> None:
        self._markers = itertools.count(1)
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.proc = subprocess.Popen(  # noqa: S603 - argument list, no shell
            [binary("lvm")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, bufsize=1,
            env=dict(os.environ, LVM_SUPPRESS_FD_WARNINGS="1", LC_ALL="C"))
        self._reader = threading.Thread(target=self._read, daemon=True, name="lvm-shell")
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def run(self, command_line: str, timeout: float = COMMAND_TIMEOUT) -> list[str]:
        """Run one command line; its output lines.

        :raise LvmShellError: the shell exited or the command overran ``timeout``.
        """
        assert self.proc.stdin is not None
        marker = f"bench-marker-{next(self._markers)}"
        self.proc.stdin.write(f"{command_line}\n{marker}\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        output: list[str] = []
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise LvmShellError(f"{command_line!r} overran {timeout:g} s; output: "
                                    f"{output}") from None
            if line is None:
                raise LvmShellError(f"lvm shell exited during {command_line!r}: {output}")
            if marker in line:
                return output
            output.append(line)

    def close(self) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write("exit\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=COMMAND_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(timeout=COMMAND_TIMEOUT)


def quoted_config() -> str:
    if '"' in lvm.FAST_CONFIG:
        raise ValueError("FAST_CONFIG cannot be quoted for the lvm shell")
    return f'"{lvm.FAST_CONFIG}"'


def lv_sizes(vg: str) -> dict[str, int]:
    """Every LV's size in ``vg``, from one ``lvs`` (each ``lvs`` costs LVM's start-up)."""
    out = sh("lvs", "--reportformat", "json", "--units", "b", "--nosuffix", "-o",
             "lv_name,lv_size", vg)
    return {row["lv_name"]: int(row["lv_size"]) for row in json.loads(out)["report"][0]["lv"]}


def compare(rounds: int) -> dict[str, Any]:
    """``rounds`` interleaved (lvs, lvextend) pairs each way; seconds per call."""
    return asyncio.run(_compare(rounds))


async def _compare(rounds: int) -> dict[str, Any]:
    times: dict[str, list[float]] = {k: [] for k in (
        "plain_lvextend", "shell_lvextend", "plain_lvs_lvextend", "shell_lvs_lvextend")}
    with loop_vg(2 * rounds * STEP + 256 * MiB, prefix="shl") as vg:
        vg.create_lv("plain", STEP)
        vg.create_lv("shell", STEP)
        shells = LvmShells()
        try:
            await lvm.lv_info(vg.name, "shell", shells=shells)  # start-up paid once, as pvestord
            if not shells.pids():
                raise RuntimeError("the lvm shell did not start (see the warning above)")
            size = STEP
            for _ in range(rounds):
                size += STEP
                for side, pool in (("plain", None), ("shell", shells)):
                    began = time.perf_counter()
                    await lvm.lv_info(vg.name, side, shells=pool)
                    listed = time.perf_counter()
                    await lvm.extend(vg.name, side, size, shells=pool)
                    ended = time.perf_counter()
                    times[f"{side}_lvextend"].append(ended - listed)
                    times[f"{side}_lvs_lvextend"].append(ended - began)
                in_lvm = lv_sizes(vg.name)
                for lv in ("plain", "shell"):
                    if not in_lvm.get(lv) == vg.device_size(lv) == size:
                        raise RuntimeError(f"LV {lv}: LVM says {in_lvm.get(lv)}, device-mapper "
                                           f"{vg.device_size(lv)}, expected {size}")
        finally:
            await shells.close()
    return {"rounds": rounds, "step": STEP, "summary": {k: summary(v) for k, v in times.items()},
            "samples": times}
