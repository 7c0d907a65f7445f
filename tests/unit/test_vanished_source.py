"""The daemon's storage configuration source when a ``pvestord:`` section vanishes.

On files alone (the Proxmox-driven test, tests/proxmox/test_rolling_install.py,
needs the Proxmox sources): the error is logged once per daemon, the storage
stays thin with its last settings, the copy is on disk for the next daemon,
and a damaged copy does not stop the daemon.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from pvestord.adapters import keptsections
from pvestord.engine import metrics, status
from pvestord.engine.configsource import StorageConfigSource
from pvestord.features import preflight, restore
from pvestord.policy.preflight import Level
from pvestord.policy.sizes import GiB

SECTION = "pvestord: thin1\n\tvgname vg1\n\tshared 1\n\tpvestord-chunksize 2G\n"
OTHERS = "dir: local\n\tpath /var/lib/vz\n"


def rewrite(path: Path, text: str) -> None:
    """With an mtime a second past the last: a change for the source's stat."""
    before = path.stat().st_mtime_ns
    path.write_text(text)
    os.utime(path, ns=(before + 1_000_000_000, before + 1_000_000_000))


def vanished_errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if getattr(r, "STORAGE_STATE", None) == "vanished" and r.levelno == logging.ERROR]


def test_a_vanished_section_stays_thin_and_is_said_once_per_daemon(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg, kept = tmp_path / "storage.cfg", tmp_path / "state" / keptsections.FILE_NAME
    cfg.write_text(OTHERS + "\n" + SECTION)
    source = StorageConfigSource(cfg, kept_file=kept)
    assert source.get().thin_storages["thin1"].chunksize == 2 * GiB
    assert keptsections.read(kept)["thin1"].text == SECTION
    rewrite(cfg, OTHERS)
    config = source.get()
    assert config.thin_storages["thin1"].chunksize == 2 * GiB  # still served
    assert config.vg_users("vg1") == [("thin1", True)]  # and still locked by its id
    [error] = vanished_errors(caplog)
    assert (error.STORAGE, error.SECTION) == ("thin1", SECTION)  # type: ignore[attr-defined]
    rewrite(cfg, OTHERS + "\n")  # another edit, still without it: not said again
    source.get()
    assert len(vanished_errors(caplog)) == 1
    view = status.snapshot(node="n1", pid=1, now=0.0, activity=status.Activity(), drives=[],
                           queue_length=0, paused_vms=0, accounts={}, lvm_shell_restarts=0,
                           sections=source.kept)
    assert 'pvestord_storage_vanished{storage="thin1"} 1\n' in metrics.render(view)
    # The next daemon reads the copy, and says it again.
    StorageConfigSource(cfg, kept_file=kept).get()
    assert len(vanished_errors(caplog)) == 2
    # Back (pvestord storage restore, or the admin): served from the file again.
    rewrite(cfg, OTHERS + "\n" + SECTION.replace("2G", "4G"))
    assert source.get().thin_storages["thin1"].chunksize == 4 * GiB
    assert source.vanished == {}
    assert any(getattr(r, "STORAGE_STATE", None) == "back" for r in caplog.records)


def test_without_a_copy_file_the_commands_judge_nothing(tmp_path: Path) -> None:
    cfg = tmp_path / "storage.cfg"
    cfg.write_text(SECTION)
    source = StorageConfigSource(cfg)
    source.get()
    rewrite(cfg, OTHERS)
    assert "thin1" not in source.get().thin_storages
    assert list(tmp_path.iterdir()) == [cfg]


def test_a_damaged_copy_is_started_afresh(tmp_path: Path,
                                          caplog: pytest.LogCaptureFixture) -> None:
    cfg, kept = tmp_path / "storage.cfg", tmp_path / keptsections.FILE_NAME
    cfg.write_text(SECTION)
    kept.write_text("{not json")
    source = StorageConfigSource(cfg, kept_file=kept)
    assert "thin1" in source.get().thin_storages
    assert any(getattr(r, "CONFIG", None) == "kept-unreadable" for r in caplog.records)
    assert keptsections.read(kept)["thin1"].text == SECTION


def test_a_storage_removed_on_purpose_is_forgotten_and_no_longer_served(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg, kept = tmp_path / "storage.cfg", tmp_path / keptsections.FILE_NAME
    cfg.write_text(OTHERS + "\n" + SECTION)
    source = StorageConfigSource(cfg, kept_file=kept)
    source.get()
    with pytest.raises(restore.RestoreError, match="nothing to forget"):
        restore.forget(cfg, kept, "thin1")  # still there: the daemon would keep it anyway
    rewrite(cfg, OTHERS)
    assert "thin1" in source.get().thin_storages
    assert restore.forget(cfg, kept, "thin1").text == SECTION
    source.reload_kept()  # what SIGHUP (systemctl reload pvestord) does
    assert "thin1" not in source.get().thin_storages
    assert source.vanished == {} and keptsections.read(kept) == {}
    with pytest.raises(restore.RestoreError, match="no copy of storage 'thin1'"):
        restore.forget(cfg, kept, "thin1")


def test_the_preflight_fails_for_a_kept_section_gone_from_the_file(tmp_path: Path) -> None:
    cfg, kept = tmp_path / "storage.cfg", tmp_path / keptsections.FILE_NAME
    cfg.write_text(OTHERS + "\n" + SECTION)
    StorageConfigSource(cfg, kept_file=kept).get()
    where = preflight.Where(node="n1", storage_config=cfg, kept_sections=kept)
    assert all(f.level is not Level.FAIL for f in preflight.storage_checks(where)[1])
    rewrite(cfg, OTHERS)  # no daemon needed to have noticed: the file is what counts
    [failed] = [f for f in preflight.storage_checks(where)[1] if f.level is Level.FAIL]
    assert "storage 'thin1' is gone" in failed.what
    assert "pvestord storage restore thin1 --apply" in failed.todo
