"""The lvm shell's pure parts: the command line it writes, the status it reads,
and the typed errors LVM's messages become (the same for a shell and a process).

The shell itself runs against real LVM in the node tier
(tests/integration/node/test_lvm_shell.py); the documents here are copies of
what LVM 2.03 wrote there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pvestord.adapters import lvm, lvmshell
from pvestord.adapters.command import KILL_WAIT, UnkillableCommandError
from pvestord.adapters.lvm import FAST_CONFIG, LvmError, LvMissingError, VgFullError, _classify
from pvestord.adapters.lvmshell import (
    SET_BY_PROFILE,
    LvmShellError,
    LvmShells,
    command_line,
    command_status,
)
from pvestord.errors import CommandError

#: What an argument may hold and still pass through LVM's splitting of a line.
quotable = st.text(st.characters(blacklist_characters="\"'\\\n\r",
                                 blacklist_categories=("Cs", "Cc")), min_size=1)


def test_bare_words_stay_bare_and_the_config_is_one_quoted_word() -> None:
    line = command_line(["lvextend", "--config", FAST_CONFIG, "-q", "--size", "16777216b",
                         "vg/vm-101-disk-0.qcow2"])
    assert line == (f'lvextend --config "{FAST_CONFIG}" -q --size 16777216b '
                    "vg/vm-101-disk-0.qcow2\n")


def test_the_report_format_is_the_profiles_and_left_off_the_line() -> None:
    """LVM 2.03.31 fails a shell command that names --reportformat at all."""
    line = command_line(["lvs", "--config", FAST_CONFIG, "--reportformat", "json", "--units",
                         "b", "vg/lv"])
    assert line == f'lvs --config "{FAST_CONFIG}" --units b vg/lv\n'
    for other in (["--reportformat", "basic"], ["--reportformat"]):
        with pytest.raises(ValueError, match="whose profile sets json"):
            command_line(["lvs", *other, "vg/lv"])


@given(st.lists(quotable.filter(lambda arg: arg not in SET_BY_PROFILE), min_size=1,
                max_size=8))
def test_the_line_splits_back_into_the_arguments(args: list[str]) -> None:
    line = command_line(args)
    assert line.endswith("\n") and line.count("\n") == 1
    assert shlex.split(line) == args


@pytest.mark.parametrize("arg", ['say "hi"', "it's", "back\\slash", "two\nlines", "cr\r"])
def test_what_lvm_cannot_split_is_refused(arg: str) -> None:
    with pytest.raises(ValueError, match="cannot be passed to the lvm shell"):
        command_line(["lvs", arg])


def _entry(log_type: str, message: str, ret: int, context: str = "processing",
           name: str = "vg0") -> dict[str, str]:
    return {"log_type": log_type, "log_context": context, "log_object_type": "cmd",
            "log_object_name": name, "log_message": message, "log_ret_code": str(ret)}


def test_success_is_the_shell_status_of_the_command() -> None:
    document = {"report": [{"lv": []}], "log": [
        _entry("status", "success", 1), _entry("status", "success", 1, "shell", "lvs")]}
    assert command_status(document, "lvs") == (1, [])


def test_a_failure_brings_its_error_messages() -> None:
    document = {"log": [
        _entry("error", "Insufficient free space: 1020 extents needed, but only 123 "
               "available", 0),
        _entry("status", "failure", 5),
        _entry("status", "failure", 5, "shell", "lvextend")]}
    status, errors = command_status(document, "lvextend")
    assert status == 5
    assert errors == ["Insufficient free space: 1020 extents needed, but only 123 available"]


@pytest.mark.parametrize("document", [
    {},
    {"log": []},
    {"report": [{"lv": []}]},
    {"log": [_entry("status", "success", 1)]},  # no shell-level status
    {"log": [_entry("status", "success", 1, "shell", "lvs")]},  # another command's
    {"log": [{**_entry("status", "success", 1, "shell", "lvextend"), "log_ret_code": "x"}]},
])
def test_a_document_that_is_not_the_commands_answer_is_a_shell_error(
        document: dict[str, object]) -> None:
    with pytest.raises(LvmShellError):
        command_status(document, "lvextend")


#: A stand-in for ``lvm`` (through PVESTORD_LVM) that fails every command
#: with status 5 and the message given in its environment.
SIZE_ANSWER = """#!/bin/sh
echo "  $PVESTORD_TEST_LVM_SAYS" >&2
exit 5
"""


@pytest.mark.parametrize("says", [
    "New size (4 extents) matches existing size (4 extents).",  # lvm2 2.03.16
    "No size change.",  # lvm2 2.03.31, Proxmox VE 9's
])
async def test_a_resize_to_the_size_the_lv_has_is_done_in_every_lvm_release(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, says: str) -> None:
    fake = tmp_path / "lvm"
    fake.write_text(SIZE_ANSWER)
    fake.chmod(0o755)
    monkeypatch.setenv("PVESTORD_LVM", str(fake))
    monkeypatch.setenv("PVESTORD_TEST_LVM_SAYS", says)
    await lvm.extend("vg0", "vm-101-disk-0.qcow2", 16 * 1024 * 1024)
    await lvm.reduce("vg0", "vm-101-disk-0.qcow2", 16 * 1024 * 1024)
    monkeypatch.setenv("PVESTORD_TEST_LVM_SAYS", "Insufficient free space: 4 extents needed")
    with pytest.raises(LvmError):
        await lvm.extend("vg0", "vm-101-disk-0.qcow2", 16 * 1024 * 1024)


#: What lvm2 2.03.31 answers ``lvs --reportformat json`` about a VG it cannot
#: see: the error in the report's log on stdout, nothing on stderr.
MISSING_VG_REPORT = {"log": [
    {"log_seq_num": "1", "log_type": "error", "log_context": "processing",
     "log_object_type": "vg", "log_object_name": "vg0",
     "log_message": 'Volume group "vg0" not found', "log_errno": "-1", "log_ret_code": "0"},
    {"log_seq_num": "2", "log_type": "status", "log_context": "processing",
     "log_object_type": "vg", "log_object_name": "vg0", "log_message": "failure",
     "log_errno": "-1", "log_ret_code": "5"}]}


async def test_an_error_lvm_reports_in_its_json_log_is_typed_as_on_stderr(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = tmp_path / "report.json"
    report.write_text(json.dumps(MISSING_VG_REPORT, indent=2))
    fake = tmp_path / "lvm"
    fake.write_text(f"#!/bin/sh\ncat {report}\nexit 5\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PVESTORD_LVM", str(fake))
    with pytest.raises(LvMissingError, match='Volume group "vg0" not found'):
        await lvm.lv_info("vg0", "vm-101-disk-0.qcow2")
    # The same through the shells' fallback: a shell that cannot start (this
    # stand-in is no shell) runs the command as a process.
    with pytest.raises(LvMissingError, match='Volume group "vg0" not found'):
        await lvm.lv_info("vg0", "vm-101-disk-0.qcow2", shells=LvmShells())


@pytest.mark.parametrize(("stderr", "kind"), [
    # lvs of a missing LV, as a process and in the shell
    ('  Failed to find logical volume "vg0/nosuch"', LvMissingError),
    # lvextend of a missing LV (both ways)
    ("  Logical volume nosuch not found in volume group vg0.", LvMissingError),
    ('  Volume group "nosuchvg" not found', LvMissingError),
    ("  Insufficient free space: 1020 extents needed, but only 123 available", VgFullError),
])
def test_lvm_messages_map_to_typed_errors(stderr: str, kind: type[LvmError]) -> None:
    error = _classify(CommandError(["lvm", "lvextend"], 5, stderr), "extending vg0/nosuch")
    assert type(error) is kind


# -- a shell that SIGKILL does not end -------------------------------------------------

#: A stand-in for ``lvm`` as a shell, speaking just enough of its protocol
#: (one JSON report document per command on LVM_REPORT_FD, ending with the
#: command's ``shell`` status) to start; every command after ``version``
#: hangs, as one stuck on a dead SAN path would. It writes its pid first.
FAKE_SHELL = """#!{python}
import json, os, sys, time
open({pid_file!r}, "w").write(str(os.getpid()))
report = os.fdopen(int(os.environ["LVM_REPORT_FD"]), "w")
for line in sys.stdin:
    name = line.split()[0]
    if name != "version":
        time.sleep(120)
    report.write(json.dumps({{"log": [{{"log_type": "status", "log_context": "shell",
        "log_object_name": name, "log_ret_code": "1"}}]}}) + "\\n")
    report.flush()
"""


def sigkill_lost_in_d_state(pid: int) -> None:
    """Stands in for a SIGKILL to a process in D state, which cannot be made
    here without a stuck device: it has no effect (yet)."""


async def test_a_shell_sigkill_does_not_end_is_not_waited_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pid_file = tmp_path / "shell.pid"
    fake = tmp_path / "lvm"
    fake.write_text(FAKE_SHELL.format(python=sys.executable, pid_file=str(pid_file)))
    fake.chmod(0o755)
    monkeypatch.setenv("PVESTORD_LVM", str(fake))
    monkeypatch.setattr(lvmshell, "kill_group", sigkill_lost_in_d_state)
    shell = lvmshell.LvmShell("vg0")
    try:
        await asyncio.wait_for(shell.start(), 60)
        pid = int(pid_file.read_text())
        started = time.monotonic()
        with pytest.raises(UnkillableCommandError) as info:
            await asyncio.wait_for(shell.run(["lvm", "lvextend", "vg0/lv"], timeout=1.0),
                                   1.0 + KILL_WAIT + 10)
        assert time.monotonic() - started >= 1.0 + KILL_WAIT * 0.9
        assert pid in info.value.pids
        assert info.value.argv == ["lvm", "lvextend", "vg0/lv"]
        assert not shell.running  # forgotten: the next command starts a new shell
    finally:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
