"""Fuzzing what QEMU sends: QMP replies, the image info in them, events and hellos.

Replies and events with missing, extra and wrong-typed fields give a
correct result or the module's own error, never a KeyError, TypeError or
AttributeError. A per-VM pass (``Daemon._pass_inner``) handles
:class:`PvestordError`; anything else is a bug it logs with a traceback. So
the properties here are "a result, or a :class:`PvestordError`", and the
figures a parser returns must be ones the pass can use without raising.
Valid shapes are those of tests/unit/test_qmp_replies.py and test_events.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import socket
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st
from qemu.qmp.models import Greeting

from pvestord.adapters.qemu_img import (
    CheckStatus,
    Measure,
    QemuImgError,
    parse_check,
    parse_info,
    parse_measure,
    required_size,
)
from pvestord.adapters.qmp import migration_status_from, run_state_from, thin_drives_from
from pvestord.adapters.queue import VMID_MAX, VMID_MIN, Entry, check_block_node
from pvestord.engine.drive import Drive
from pvestord.engine.migration import MIGRATING
from pvestord.errors import PvestordError
from pvestord.policy import BlockDevice
from qmeventd_py import events
from qmeventd_py.hello import read_hello
from qmeventd_py.peer import PeerError

fuzz = settings(max_examples=200, deadline=None)

MiB = 1024 * 1024
LV = "/dev/san/vm-101-disk-0.qcow2"

# -- junk, and valid examples with junk put in

junk = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats()
    | st.sampled_from(["", "4096", "-1", "1e3", "nospace", "qcow2", "host_device", LV, "e0"])
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner,
                                                                  max_size=3),
    max_leaves=10)


@st.composite
def mutated(draw: st.DrawFn, value: Any) -> Any:
    """``value`` with some members dropped, added, replaced by junk or mutated in turn."""
    if isinstance(value, dict):
        out = {}
        for key, member in value.items():
            action = draw(st.sampled_from(["keep", "keep", "keep", "drop", "junk", "mutate"]))
            if action == "keep":
                out[key] = member
            elif action == "junk":
                out[key] = draw(junk)
            elif action == "mutate":
                out[key] = draw(mutated(member))
        out.update(draw(st.dictionaries(st.text(max_size=10), junk, max_size=2)))
        return out
    if isinstance(value, list):
        items = [draw(mutated(item)) for item in value
                 if draw(st.sampled_from([True, True, True, False]))]
        return items + draw(st.lists(junk, max_size=2))
    return draw(st.sampled_from([value, value, value]) | junk)


def replies_from(valid: Any) -> st.SearchStrategy[Any]:
    """The valid reply, mutated copies of it, and plain junk."""
    return st.one_of(st.just(copy.deepcopy(valid)), mutated(valid), mutated(valid), junk)


# -- block nodes and blockstats (thin_drives_from)


def node(name: str, drv: str, path: str, *, size: int, threshold: int = 0) -> dict[str, Any]:
    return {"node-name": name, "drv": drv, "file": path, "ro": False,
            "write_threshold": threshold, "image": {
                "filename": path, "format": drv, "virtual-size": size, "cluster-size": 65536,
                "format-specific": {"type": drv, "data": {
                    "compat": "1.1", "refcount-bits": 16, "extended-l2": False,
                    "corrupt": False, "bitmaps": [{"name": "b0", "granularity": 65536,
                                                   "flags": ["auto"]}]}}}}


def unchanged(reply: Any, original: Any) -> bool:
    """Whether the strategy left ``reply`` as it was. Compared as JSON: ``==``
    takes a mutated ``0`` for ``False``, which the parsers rightly refuse
    (QEMU sends a bool)."""
    return json.dumps(reply, sort_keys=True) == json.dumps(original, sort_keys=True)


NODES = [node("f0", "qcow2", LV, size=8192 * MiB),
         node("e0", "host_device", LV, size=256 * MiB, threshold=128 * MiB)]
STATS = [{"node-name": "e0", "stats": {"wr_highest_offset": 42 * MiB}},
         {"node-name": "f0", "stats": {"wr_highest_offset": 7}}]


@fuzz
@given(replies_from(NODES), replies_from(STATS))
@example(  # Found by this test: negative figures and a bool threshold passed as sizes.
    [{**NODES[0], "image": {**NODES[0]["image"], "virtual-size": -1}}, NODES[1]], STATS)
@example([NODES[0], {**NODES[1], "write_threshold": True}],
         [{"node-name": "e0", "stats": {"wr_highest_offset": -7}}])
def test_block_replies_give_drives_a_pass_can_use(nodes: Any, stats: Any) -> None:
    drives = thin_drives_from(nodes, stats)
    if unchanged([nodes, stats], [NODES, STATS]):
        [drive] = drives
        assert (drive.file_node, drive.format_node, drive.path) == ("e0", "f0", LV)
        assert (drive.allocation, drive.threshold) == (42 * MiB, 128 * MiB)
    for drive in drives:
        for figure in (drive.virtual_size, drive.allocation, drive.threshold):
            assert type(figure) is int and figure >= 0
        # What the pass does with a view next: the policy's state, the image's maximum.
        Drive(drive, "san", "vm-101-disk-0.qcow2", None, maximum=drive.virtual_size,
              extent_size=4 * MiB, lv_size=drive.virtual_size).state()
        try:
            info = parse_info(drive.image)
        except QemuImgError:
            continue
        required_size(info, Measure(required=1, fully_allocated=1))


# -- query-status and query-block (run_state_from)

STATUS = {"running": False, "singlestep": False, "status": "io-error"}
BLOCK = [{"device": "drive-scsi0", "io-status": "nospace", "locked": False,
          "inserted": {"file": LV, "node-name": "f0", "ro": False}},
         {"device": "ide2", "io-status": "ok", "removable": True}]


@fuzz
@given(replies_from(STATUS), replies_from(BLOCK))
def test_status_replies_give_a_run_state(status: Any, block: Any) -> None:
    state = run_state_from(status, block)
    assert isinstance(state.status, str) and isinstance(state.running, bool)
    assert all(isinstance(device, BlockDevice)
               for device in state.nospace_devices + state.failed_devices)
    assert isinstance(state.nospace_on(LV), bool)
    if unchanged([status, block], [STATUS, BLOCK]):
        assert state.paused_on_nospace and state.nospace_on(LV)


# -- query-migrate

MIGRATE = {"status": "active", "total-time": 1234, "ram": {"transferred": 1, "remaining": 2}}


@fuzz
@given(replies_from(MIGRATE))
@example({"status": ["active"]})  # Found by this test: unhashable, `in MIGRATING` raised
def test_migrate_replies_give_a_status_or_none(reply: Any) -> None:
    status = migration_status_from(reply)
    assert status is None or isinstance(status, str)
    assert isinstance(status in MIGRATING, bool)
    if reply == MIGRATE:
        assert status == "active"


# -- the image info inside a block node, and qemu-img's own JSON

INFO = NODES[0]["image"]


@fuzz
@given(replies_from(INFO))
@example({**INFO, "virtual-size": float("inf")})  # Found by this test: OverflowError
@example({**INFO, "format-specific": {"data": {"bitmaps": [{"name": "b", "granularity": 0}]}}})
@example({**INFO, "cluster-size": -5})  # Found by this test: ValueError in align_up
def test_image_info_is_usable_or_a_qemu_img_error(data: Any) -> None:
    # Found by this test: granularity 0 passed, then divided by zero in bitmaps_size.
    try:
        info = parse_info(data)
    except QemuImgError as err:
        assert isinstance(err, PvestordError)
        return
    assert info.virtual_size >= 0
    required_size(info, Measure(required=1, fully_allocated=1))
    if data == INFO:
        assert (info.virtual_size, info.cluster_size) == (8192 * MiB, 65536)
        assert [(b.name, b.granularity) for b in info.bitmaps] == [("b0", 65536)]


MEASURE = {"required": 196608, "fully-allocated": 8591507456, "bitmaps": 0}
CHECK = {"image-end-offset": 262144, "total-clusters": 131072, "allocated-clusters": 1,
         "fragmented-clusters": 0, "check-errors": 0, "filename": LV, "format": "qcow2"}


@fuzz
@given(replies_from(MEASURE), replies_from(CHECK))
@example({"required": float("inf"), "fully-allocated": 1}, {"leaks": float("-inf")})
def test_qemu_img_replies_give_a_result_or_a_qemu_img_error(measure: Any, check: Any) -> None:
    for parse in (lambda: parse_measure(measure), lambda: parse_check(check, CheckStatus.CLEAN)):
        with contextlib.suppress(QemuImgError):
            parse()


# -- events (qmeventd)

EVENTS = [
    {"event": "BLOCK_WRITE_THRESHOLD", "data": {"node-name": "e0", "amount-exceeded": 4096,
                                                "write-threshold": 128 * MiB},
     "timestamp": {"seconds": 1700000000, "microseconds": 1}},
    {"event": "BLOCK_IO_ERROR", "data": {"device": "", "node-name": "f0", "operation": "write",
                                         "action": "stop", "nospace": True,
                                         "reason": "No space left on device"},
     "timestamp": {"seconds": 1700000000, "microseconds": 2}},
    {"event": "SHUTDOWN", "data": {"guest": True, "reason": "guest-shutdown"},
     "timestamp": {"seconds": 1700000000, "microseconds": 3}},
]


@fuzz
@given(st.sampled_from(EVENTS).flatmap(replies_from),
       st.integers(-(2**40), 2**40), st.integers(-1, 2**64))
def test_events_give_an_action_and_an_entry_or_a_reason(message: Any, vmid: int,
                                                         ts: int) -> None:
    action = events.classify(message)
    assert action is None or isinstance(action, events.QueueRequest | events.Shutdown
                                        | events.Rejected)
    if isinstance(action, events.QueueRequest):
        check_block_node(action.block_node)
        entry = events.to_entry(vmid, action, origin="pve1", ts=ts)
        if isinstance(entry, Entry):
            assert VMID_MIN <= entry.vmid <= VMID_MAX and entry.block_node == action.block_node
        else:
            assert isinstance(entry, events.Rejected) and entry.why
    if message in EVENTS:
        assert isinstance(action, events.QueueRequest | events.Shutdown)


# -- the first message on qmeventd's socket

GREETING = {"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 7},
                                "package": "pve-qemu-kvm"}, "capabilities": []}}
VZDUMP = {"vzdump": {"vmid": "101"}}


def read_hello_from(data: bytes) -> tuple[object, str]:
    """What read_hello makes of a peer that sends ``data`` and hangs up."""
    ours, peer = socket.socketpair()
    with ours, peer:
        ours.setblocking(False)
        peer.sendall(data)
        peer.shutdown(socket.SHUT_WR)
        return asyncio.run(read_hello(ours))


hello_bytes = st.one_of(
    st.sampled_from([GREETING, VZDUMP]).flatmap(replies_from).map(
        lambda m: json.dumps(m).encode()),
    st.binary(max_size=200),
    st.integers(1, 40_000).map(lambda depth: b'{"vzdump": ' + b"[" * depth),
)


@settings(max_examples=100, deadline=None)
@given(hello_bytes)
@example(b'{"QMP": ' + b"[" * 30_000 + b"\n")  # Found by this test: RecursionError
def test_a_peers_first_message_is_a_hello_or_a_peer_error(data: bytes) -> None:
    try:
        hello, _ = read_hello_from(data)
    except PeerError:
        return
    kind = events.hello_kind(hello)
    if kind == "qmp":
        with contextlib.suppress(KeyError, TypeError):  # what the server catches next
            Greeting(hello)  # type: ignore[arg-type]
    elif kind == "vzdump":
        vmid = events.vzdump_vmid(hello)
        assert vmid is None or vmid >= 1
