"""qmeventd_py.events and peer parsing: event -> queue entry, never an exception."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from qemu.qmp import QMPClient

from pvestord.adapters.queue import Entry
from pvestord.policy import Reason
from qmeventd_py import events
from qmeventd_py.peer import Peer, vmid_from_argv
from qmeventd_py.session import VmSession

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                max_size=4),
    max_leaves=12,
)
event_names = st.sampled_from(["BLOCK_WRITE_THRESHOLD", "BLOCK_IO_ERROR", "BLOCK_JOB_ERROR",
                               "JOB_STATUS_CHANGE",
                               "SHUTDOWN", "STOP", "RESUME", ""]) | st.text(max_size=20)


def _event(name: str, data: Any) -> dict[str, Any]:
    return {"event": name, "data": data,
            "timestamp": {"seconds": 1700000000, "microseconds": 1}}


def test_threshold_names_the_file_node() -> None:
    action = events.classify(_event("BLOCK_WRITE_THRESHOLD", {
        "node-name": "file-scsi0", "write-threshold": 1 << 30, "amount-exceeded": 4096}))
    assert action == events.QueueRequest("file-scsi0", Reason.THRESHOLD)
    entry = events.to_entry(4242, action, origin="pve1", ts=1700000000)
    assert entry == Entry(4242, "file-scsi0", Reason.THRESHOLD, origin="pve1", ts=1700000000)


def test_a_threshold_on_a_node_qemu_named_itself_is_queued() -> None:
    # An active commit's base that QEMU opened as a backing image is
    # "#block<n>": its threshold events must reach the queue like any other.
    action = events.classify(_event("BLOCK_WRITE_THRESHOLD", {
        "node-name": "#block029", "write-threshold": 1 << 24, "amount-exceeded": 4096}))
    assert action == events.QueueRequest("#block029", Reason.THRESHOLD)
    hostile = events.classify(_event("BLOCK_WRITE_THRESHOLD", {
        "node-name": "#block029 reason=manual", "write-threshold": 1, "amount-exceeded": 1}))
    assert isinstance(hostile, events.Rejected)


def test_nospace_prefers_node_name_then_device() -> None:
    base = {"operation": "write", "action": "stop", "reason": "No space left on device",
            "nospace": True}
    assert events.classify(_event("BLOCK_IO_ERROR", {**base, "device": "",
                                                     "node-name": "drive-scsi0"})) == \
        events.QueueRequest("drive-scsi0", Reason.NOSPACE)
    assert events.classify(_event("BLOCK_IO_ERROR", {**base, "device": "drive-virtio0"})) == \
        events.QueueRequest("drive-virtio0", Reason.NOSPACE)
    rejected = events.classify(_event("BLOCK_IO_ERROR", {**base, "device": ""}))
    assert isinstance(rejected, events.Rejected)


def test_io_errors_other_than_nospace_are_not_ours() -> None:
    data = {"device": "", "node-name": "d0", "operation": "write", "action": "report",
            "reason": "Input/output error"}
    assert events.classify(_event("BLOCK_IO_ERROR", data)) is None
    assert events.classify(_event("BLOCK_IO_ERROR", {**data, "nospace": False})) is None
    assert events.classify(_event("BLOCK_IO_ERROR", {**data, "nospace": "true"})) is None


def test_shutdown_guest_flag() -> None:
    assert events.classify(_event("SHUTDOWN", {"guest": True, "reason": "guest-shutdown"})) \
        == events.Shutdown(True)
    assert events.classify(_event("SHUTDOWN", {"guest": False})) == events.Shutdown(False)
    assert events.classify({"event": "SHUTDOWN"}) == events.Shutdown(False)
    assert events.classify(_event("SHUTDOWN", {"guest": "yes"})) == events.Shutdown(False)


def test_a_block_job_paused_on_a_write_error_is_queued_to_be_given_room() -> None:
    # on-error stop/enospc: the job waits; its id names the entry, which as a
    # nospace entry naming no thin drive looks at every thin drive of the VM.
    data = {"device": "mirror0", "operation": "write", "action": "stop"}
    action = events.classify(_event("BLOCK_JOB_ERROR", data))
    assert action == events.QueueRequest("mirror0", Reason.JOB)
    # An id too long for a queue entry is logged; the next reconcile finds the job.
    long_id = {**data, "device": "m" * 40}
    assert events.classify(_event("BLOCK_JOB_ERROR", long_id)) == \
        events.JobWriteFailed("m" * 40, "stop")


def test_a_block_job_that_starts_is_queued_so_that_its_target_is_armed() -> None:
    change = {"id": "commit-drive-scsi0", "status": "running"}
    assert events.classify(_event("JOB_STATUS_CHANGE", change)) == \
        events.QueueRequest("commit-drive-scsi0", Reason.JOB)
    for status in ("created", "paused", "ready", "concluded", "null", None):
        assert events.classify(_event("JOB_STATUS_CHANGE", {**change, "status": status})) is None
    assert events.classify(_event("JOB_STATUS_CHANGE", {**change, "id": "j" * 40})) is None
    for bad in ("job\nforged", 5, None, "x" * 200):
        assert isinstance(events.classify(_event("JOB_STATUS_CHANGE", {**change, "id": bad})),
                          events.Rejected)


def test_a_block_job_that_failed_its_write_is_reported_never_queued() -> None:
    # qemu-server's snapshot delete: block-commit with job-id commit-drive-scsi0.
    data = {"device": "commit-drive-scsi0", "operation": "write", "action": "report"}
    assert events.classify(_event("BLOCK_JOB_ERROR", data)) == \
        events.JobWriteFailed("commit-drive-scsi0", "report")
    assert events.classify(_event("BLOCK_JOB_ERROR", {**data, "operation": "read"})) is None
    for bad in [{**data, "device": "job\nforged"}, {**data, "device": 5},
                {**data, "device": "x" * 200}, {**data, "action": "explode"}]:
        assert isinstance(events.classify(_event("BLOCK_JOB_ERROR", bad)), events.Rejected)


def test_a_block_job_write_error_lands_in_the_journal_with_its_fields(
        caplog: pytest.LogCaptureFixture) -> None:
    queued: list[Entry] = []
    session = VmSession(100, Peer(pid=1, uid=0, gid=0, pidfd=None), QMPClient("test"),
                        origin="pve1", kill_timeout=1.0, submit=queued.append,
                        spawn=lambda coro: pytest.fail("nothing to spawn"))
    with caplog.at_level(logging.WARNING, logger="qmeventd_py"):
        session.handle(_event("BLOCK_JOB_ERROR", {"device": "stream-drive-scsi0",
                                                  "operation": "write", "action": "report"}))
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert {key: record.__dict__[key] for key in ("VMID", "JOB", "JOB_ACTION")} == \
        {"VMID": "100", "JOB": "stream-drive-scsi0", "JOB_ACTION": "report"}
    assert queued == []


def test_bad_node_names_are_rejected_not_queued() -> None:
    for name in ["", "1abc", "a b", "a:b", "x" * 32, "drive\nscsi0", None, 5, ["a"]]:
        action = events.classify(_event("BLOCK_WRITE_THRESHOLD", {"node-name": name}))
        assert isinstance(action, events.Rejected), name


def test_vmid_outside_proxmox_range_is_rejected() -> None:
    action = events.QueueRequest("file-scsi0", Reason.THRESHOLD)
    assert isinstance(events.to_entry(42, action, origin="pve1", ts=1), events.Rejected)


@given(st.one_of(json_values, st.builds(_event, event_names, json_values)))
def test_classify_never_raises(message: object) -> None:
    action = events.classify(message)
    assert action is None or isinstance(action, events.QueueRequest | events.Shutdown |
                                        events.JobWriteFailed | events.Rejected)
    if isinstance(action, events.QueueRequest):
        # Whatever passed classification is a valid queue entry.
        entry = events.to_entry(100, action, origin="pve1", ts=0)
        assert isinstance(entry, Entry)


@given(st.dictionaries(st.sampled_from(["node-name", "write-threshold", "amount-exceeded",
                                        "device", "nospace", "guest", "extra"]),
                       json_values, max_size=6), event_names)
def test_missing_extra_and_wrong_typed_fields(data: dict[str, Any], name: str) -> None:
    events.classify(_event(name, data))


def test_hello_kinds() -> None:
    greeting = {"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 7},
                                    "package": ""}, "capabilities": ["oob"]}}
    assert events.hello_kind(greeting) == "qmp"
    assert events.hello_kind({"vzdump": {"vmid": "100"}}) == "vzdump"
    assert events.hello_kind({"QMP": "x"}) is None
    assert events.hello_kind([1]) is None
    assert events.hello_kind({"execute": "quit"}) is None


def test_vzdump_vmid() -> None:
    assert events.vzdump_vmid({"vzdump": {"vmid": "100"}}) == 100
    assert events.vzdump_vmid({"vzdump": {"vmid": 101}}) == 101
    for bad in [{"vzdump": {}}, {"vzdump": {"vmid": "1x"}}, {"vzdump": {"vmid": True}},
                {"vzdump": {"vmid": "-1"}}, {"vzdump": "100"}, {"vzdump": {"vmid": "0"}},
                {"vzdump": {"vmid": None}}, "vzdump"]:
        assert events.vzdump_vmid(bad) is None, bad


@given(json_values)
def test_hello_helpers_never_raise(message: object) -> None:
    events.hello_kind(message)
    events.vzdump_vmid(message)
    events.vzdump_vmid({"vzdump": message})


def test_vmid_from_argv() -> None:
    qemu = ["/usr/bin/kvm", "-machine", "none"]
    assert vmid_from_argv([*qemu, "-pidfile", "/var/run/qemu-server/4242.pid"]) == 4242
    assert vmid_from_argv([*qemu, "-id", "101", "-pidfile", "/run/x/4242.pid"]) == 101
    assert vmid_from_argv([*qemu, "-pidfile=/run/7.pid"]) == 7
    assert vmid_from_argv(qemu) is None
    assert vmid_from_argv([*qemu, "-pidfile", "/run/vm.pid"]) is None
    assert vmid_from_argv([*qemu, "-pidfile", "/run/0101.pid"]) is None
    assert vmid_from_argv([*qemu, "-pidfile"]) is None
    assert vmid_from_argv([*qemu, "-id", "abc"]) is None


@given(st.lists(st.text(max_size=30), max_size=8))
def test_vmid_from_argv_never_raises(argv: list[str]) -> None:
    vmid = vmid_from_argv(argv)
    assert vmid is None or vmid > 0
