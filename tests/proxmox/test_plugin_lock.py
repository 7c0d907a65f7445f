"""The plugin under Proxmox's storage lock: cfs_lock's alarm must stay armed.

``PVE::Cluster::cfs_lock`` runs the locked code under ``alarm(60)``: pmxcfs
expires a lock directory after 120 s, and the alarm aborts the holder before
another node can take it. The stand-in lock keeps that contract (checked
first); the plugin's call of ``pvestord plugin`` must then be aborted by the
alarm like any other locked code, never run on with the alarm put aside.

Runs on any machine with the Proxmox sources and the Perl modules (no LVM).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

from tests.proxmox import upstream
from tests.proxmox.recorded import storage_cfg_fixture

STORAGE_CFG = ("pvestord: thin1\n\tvgname vg_h1_absent\n\tcontent images\n\tshared 1\n"
               "\tsnapshot-as-volume-chain 1\n\tpvestord-chunksize 256M\n")
#: How long the slow pvestord waits before it runs: longer than the short alarm.
SLOW_START = 5
#: The short alarm the tests give the locked code.
SHORT_ALARM = 2


proxmox = storage_cfg_fixture(STORAGE_CFG)


def test_stand_in_lock_keeps_cfs_locks_contract(proxmox: upstream.Upstream) -> None:
    found = proxmox.perl_json(
        'alarm(1000);'
        'my $armed = PVE::Cluster::cfs_lock_storage("s1", undef,'
        ' sub { my $left = alarm(0); alarm($left); return $left });'
        'my $ok_err = $@;'
        'my $res = PVE::Cluster::cfs_lock_storage("s1", undef, sub { die "boom\\n" });'
        'my $err = $@;'
        '$PvestordTest::StandIns::LOCKED_COMMAND_ALARM = 1;'
        'my $late = PVE::Cluster::cfs_lock_storage("s1", undef, sub { sleep(30); return 1 });'
        'my $late_err = $@;'
        'my $caller_left = alarm(0);'
        'print encode_json({armed => $armed, ok_err => $ok_err, res => $res, err => $err,'
        ' late => $late, late_err => $late_err, caller_left => $caller_left});')
    assert (found["armed"], found["ok_err"]) == (60, None)
    assert (found["res"], found["err"]) == (None, "boom\n")
    assert found["late"] is None
    assert found["late_err"] == "'storage-s1'-locked command timed out - aborting\n"
    # The caller's own alarm is armed again once the lock is left.
    assert found["caller_left"] > 900


@contextlib.contextmanager
def slow_pvestord(folder: Path) -> Iterator[Path]:
    """A pvestord that waits :data:`SLOW_START` s, then runs the checkout's;
    it leaves ``started`` (its pid) and, when its wait is over, ``ran``."""
    # Slow only under the lock: the locks to take are asked for before it.
    wrapper = upstream.plugin_stand_in(
        folder / "pvestord",
        f"echo $$ > {folder / 'started'}\n"
        f"sleep {SLOW_START}\n"
        f"touch {folder / 'ran'}\n"
        f"exec {upstream.PVESTORD} \"$@\" <<EOF\n$request\nEOF",
        folder / "vg-unhealthy")
    try:
        yield wrapper
    finally:
        # Aborted, the wrapper is left running by run_command: end it here.
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            os.kill(int((folder / "started").read_text()), signal.SIGTERM)


def test_plugin_call_under_the_lock_is_aborted_by_its_alarm(proxmox: upstream.Upstream,
                                                             tmp_path: Path) -> None:
    with slow_pvestord(tmp_path) as wrapper:
        found = proxmox.perl_json(
            f'$PvestordTest::StandIns::LOCKED_COMMAND_ALARM = {SHORT_ALARM};'
            'my $cfg = PVE::Storage::config();'
            'eval { PVE::Storage::volume_resize($cfg, "thin1:vm-100-disk-0.qcow2",'
            ' 8 * 1024**3, 1) };'
            'print encode_json({error => "$@"});',
            PVESTORD_TEST_COMMAND=str(wrapper))
        ran = (tmp_path / "ran").exists()
    assert (tmp_path / "started").exists(), found["error"]
    assert "'storage-thin1'-locked command timed out - aborting" in found["error"]
    assert not ran
