"""The lvm shell's pure parts: the command line it writes, the status it reads,
and the typed errors LVM's messages become (the same for a shell and a process).

The shell itself runs against real LVM in the node tier
(tests/integration/node/test_lvm_shell.py); the documents here are copies of
what LVM 2.03 wrote there.
"""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pvestord.errors import CommandError
from pvestord.lvm import FAST_CONFIG, LvmError, LvMissingError, VgFullError, _classify
from pvestord.lvmshell import LvmShellError, command_line, command_status

#: What an argument may hold and still pass through LVM's splitting of a line.
quotable = st.text(st.characters(blacklist_characters="\"'\\\n\r",
                                 blacklist_categories=("Cs", "Cc")), min_size=1)


def test_bare_words_stay_bare_and_the_config_is_one_quoted_word() -> None:
    line = command_line(["lvextend", "--config", FAST_CONFIG, "-q", "--size", "16777216b",
                         "vg/vm-101-disk-0.qcow2"])
    assert line == (f'lvextend --config "{FAST_CONFIG}" -q --size 16777216b '
                    "vg/vm-101-disk-0.qcow2\n")


@given(st.lists(quotable, min_size=1, max_size=8))
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
