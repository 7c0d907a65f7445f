"""Scenario 4: a persistent ``lvm`` process against one ``lvm`` command per call.

LVM's start-up dominates an ``lvextend`` under emulation (NODE-GUEST.md).
``lvm`` with no arguments is a shell that reads commands on stdin and keeps
its configuration and library state between them; lvmdbusd keeps one
running for the same reason. Both sides here use pvestord's ``--config``
(pvestord.lvm.FAST_CONFIG); the plain side is pvestord's own code
(:func:`pvestord.lvm.lv_info`, :func:`pvestord.lvm.extend`). Rounds
interleave the two, on two LVs of one VG, so both see the same load. After
every shell extension the LV's size is checked in LVM and in device-mapper.

Measured only: the daemon does not use the shell.
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
from pvestord import lvm
from pvestord.command import binary
from tests.harness.lvmbed import MiB, loop_vg, sh

#: Budget for one command in the shell (as pvestord.lvm.CHANGE_TIMEOUT).
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


def shell_lvs(shell: LvmShell, vg: str, lv: str) -> None:
    # The shell keeps its own report format (it ignores --reportformat json
    # per command): the LV's row in columns is what we check for.
    out = shell.run(f"lvs --config {quoted_config()} --reportformat json --units b "
                    "--nosuffix -o vg_name,lv_name,lv_size,vg_extent_size,vg_free,lv_active,"
                    f"lv_device_open {vg}/{lv}")
    if not any(line.split()[:2] == [vg, lv] for line in out if line.strip()):
        raise LvmShellError(f"lvs in the shell did not report {vg}/{lv}: {out}")


def shell_lvextend(shell: LvmShell, vg: str, lv: str, size: int) -> None:
    # -q does not quieten the shell: it reports the resize like a verbose run.
    out = shell.run(f"lvextend --config {quoted_config()} -q --size {size}b {vg}/{lv}")
    if not any("successfully resized" in line for line in out):
        raise LvmShellError(f"lvextend in the shell did not resize {vg}/{lv}: {out}")


def lv_sizes(vg: str) -> dict[str, int]:
    """Every LV's size in ``vg``, from one ``lvs`` (each ``lvs`` costs LVM's start-up)."""
    out = sh("lvs", "--reportformat", "json", "--units", "b", "--nosuffix", "-o",
             "lv_name,lv_size", vg)
    return {row["lv_name"]: int(row["lv_size"]) for row in json.loads(out)["report"][0]["lv"]}


def compare(rounds: int) -> dict[str, Any]:
    """``rounds`` interleaved (lvs, lvextend) pairs each way; seconds per call."""
    return asyncio.run(_compare(rounds))


async def _compare(rounds: int) -> dict[str, Any]:
    # One event loop for the plain side, as in the daemon; the shell's calls
    # block it, which is harmless here.
    times: dict[str, list[float]] = {k: [] for k in (
        "plain_lvextend", "shell_lvextend", "plain_lvs_lvextend", "shell_lvs_lvextend")}
    with loop_vg(2 * rounds * STEP + 256 * MiB, prefix="shl") as vg:
        vg.create_lv("plain", STEP)
        vg.create_lv("shell", STEP)
        shell = LvmShell()
        try:
            shell.run("version")  # start-up is paid once, as a daemon would
            size = STEP
            for _ in range(rounds):
                size += STEP
                began = time.perf_counter()
                await lvm.lv_info(vg.name, "plain")
                listed = time.perf_counter()
                await lvm.extend(vg.name, "plain", size)
                ended = time.perf_counter()
                times["plain_lvextend"].append(ended - listed)
                times["plain_lvs_lvextend"].append(ended - began)
                began = time.perf_counter()
                shell_lvs(shell, vg.name, "shell")
                listed = time.perf_counter()
                shell_lvextend(shell, vg.name, "shell", size)
                ended = time.perf_counter()
                times["shell_lvextend"].append(ended - listed)
                times["shell_lvs_lvextend"].append(ended - began)
                in_lvm = lv_sizes(vg.name)
                for lv in ("plain", "shell"):
                    if not in_lvm.get(lv) == vg.device_size(lv) == size:
                        raise RuntimeError(f"LV {lv}: LVM says {in_lvm.get(lv)}, device-mapper "
                                           f"{vg.device_size(lv)}, expected {size}")
        finally:
            shell.close()
    return {"rounds": rounds, "step": STEP, "summary": {k: summary(v) for k, v in times.items()},
            "samples": times}
