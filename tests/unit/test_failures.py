"""What a failed pass says in the journal: once, with its kind in words."""

from __future__ import annotations

import logging

import pytest

from pvestord.adapters.lockheld import LockTimeout
from pvestord.adapters.qmp import VmBusyError
from pvestord.engine.failures import Failures, failure_kind
from pvestord.errors import CommandError


def test_a_failure_kind_is_its_class_in_words() -> None:
    assert failure_kind(LockTimeout.__new__(LockTimeout)) == "lock-timeout"
    assert failure_kind(CommandError(["lvextend"], 5, "")) == "command"
    assert failure_kind(VmBusyError("later")) == "vm-busy"
    assert failure_kind(OSError()) == "os"
    assert failure_kind(TimeoutError()) == "timeout"


def test_a_failure_is_logged_once_with_its_kind(caplog: pytest.LogCaptureFixture) -> None:
    failures = Failures(reconcile=lambda vmid: None, wake=lambda: None)
    error = CommandError(["lvextend"], 5, "Insufficient free space")
    with caplog.at_level(logging.DEBUG, logger="pvestord"):
        failures.note_error((101, "e1"), error)
        failures.note_error((101, "e1"), error)
        failures.clear_error((101, "e1"), "VM 101 e1: extensions work again")
    first, again, recovered = caplog.records
    assert (first.levelno, getattr(first, "FAILURE", None), getattr(first, "VMID", None)) == \
        (logging.ERROR, "command", "101")
    assert (again.levelno, getattr(again, "STILL_FAILING", None)) == (logging.DEBUG, "yes")
    assert getattr(recovered, "RECOVERED", None) == "yes"
    # A failure of the daemon's own, given as words: no kind to tell.
    failures.note_error((0, "queue"), "cannot read the extend queue")
    assert not hasattr(caplog.records[-1], "FAILURE")
