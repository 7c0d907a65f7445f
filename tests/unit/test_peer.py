"""How qmeventd-py names a peer it refuses: one word for the journal, and a
log line the peer cannot forge."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qmeventd_py.peer import Peer, PeerError, vmid_of


def test_a_peer_without_a_vmid_is_refused_in_one_log_line(tmp_path: Path) -> None:
    # A peer writes its own command line: here with a line that would pass
    # for one of ours, were it printed as it is.
    pid = os.getpid()
    (tmp_path / str(pid)).mkdir()
    forged = "\n2026-12-04 17:00:00,000 qmeventd-py INFO qmeventd_py: VM 100: queued"
    (tmp_path / str(pid) / "cmdline").write_bytes(
        b"\0".join([b"python3", b"-c", forged.encode()]) + b"\0")
    peer = Peer(pid, 0, 0, os.pidfd_open(pid))
    try:
        with pytest.raises(PeerError) as refused:
            vmid_of(peer, proc=tmp_path)
    finally:
        peer.close()
    assert refused.value.why == "not-a-vm"
    assert "\n" not in str(refused.value) and "queued" in str(refused.value)


def test_a_vm_is_named_by_its_pidfile(tmp_path: Path) -> None:
    pid = os.getpid()
    (tmp_path / str(pid)).mkdir()
    (tmp_path / str(pid) / "cmdline").write_bytes(
        b"\0".join([b"qemu-system-x86_64", b"-pidfile", b"/var/run/qemu-server/101.pid"]))
    peer = Peer(pid, 0, 0, os.pidfd_open(pid))
    try:
        assert vmid_of(peer, proc=tmp_path) == 101
    finally:
        peer.close()
