"""A storage edit on a node without pvestord's plugin, as the real Proxmox makes it.

During a rolling install (docs/operations.md, "Rolling install"), Proxmox on a node without the
plugin reads storage.cfg without the ``pvestord:`` sections (it does not know
the type) and writes back only what it read. The storage.cfg here is written
by the real PVE::Storage twice: once with the plugin registered (the layout
every node reads), then with no plugin at all (``PVESTORD_TEST_NO_REGISTER``
and none installed: what such a node's ``pvesm``/GUI edit ends in). In
between, the real ``pvestord run`` (files only, no VM, no LVM) reads it:
its journal record, its published status (``pvestord status`` and the
metric), and ``pvestord storage restore``, whose output the real Proxmox
reads again as the same storage.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from pvestord.engine import metrics
from tests.harness.daemons import Daemon
from tests.proxmox import upstream

TIMEOUT = 60.0
#: The project's own code, whatever ``pvestord`` the venv's script would import.
ENV = {"PYTHONPATH": str(upstream.REPO)}

CFG = """\
dir: local
\tpath /var/lib/vz
\tcontent iso,vztmpl,backup

pvestord: thin1
\tvgname vg_san1
\tcontent images
\tshared 1
\tsnapshot-as-volume-chain 1
\tpvestord-chunksize 256M
\tpvestord-initial-size 1G

lvm: thick1
\tvgname vg_san2
\tcontent images
\tshared 1
"""


def pvestord(*args: str) -> list[str]:
    return [sys.executable, "-c", "import sys; from pvestord.cli import main; sys.exit(main())",
            *args]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(pvestord(*args), capture_output=True, text=True,  # noqa: S603
                          timeout=TIMEOUT, check=False, env={**os.environ, **ENV},
                          cwd=upstream.REPO)


def written_by_proxmox(proxmox: upstream.Upstream, text: str, *, plugin: bool) -> str:
    """``text`` read and written back by PVE::Storage, on a node with or without the plugin."""
    proxmox.write_storage_cfg(text)
    extra = {} if plugin else {"PVESTORD_TEST_NO_REGISTER": "1"}
    done = proxmox.perl(upstream.READ_AND_WRITE, **extra)
    assert done.returncode == 0, done.stderr
    return done.stdout


def rewrite(path: Path, text: str) -> None:
    """As pmxcfs replaces it, with an mtime past the last: a change for the daemon's stat."""
    before = path.stat().st_mtime_ns
    path.write_text(text)
    os.utime(path, ns=(before + 1_000_000_000, before + 1_000_000_000))


class Run(Daemon):
    def __init__(self, tmp: Path) -> None:
        (tmp / "run").mkdir(exist_ok=True)
        super().__init__("pvestord", pvestord(
            "-v", "--queue", str(tmp / "extend-queue"), "run",
            "--storage-config", str(tmp / "storage.cfg"), "--run-dir", str(tmp / "run"),
            "--vg-health-dir", str(tmp / "state" / "vg-unhealthy"),
            "--state-dir", str(tmp / "state" / "lib"),
            "--node", "n1", "--poll-interval", "0.2", "--no-journal", "--no-lvm-shell"),
            tmp / "pvestord.log", env=ENV)


def published(path: Path, ready: str) -> dict[str, object]:
    """The daemon's status view once ``ready`` is in it (it publishes every 2 s)."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        try:
            view = json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            view = {}
        if ready in json.dumps(view):
            return dict(view)
        time.sleep(0.1)
    raise TimeoutError(f"no {ready!r} in {path}")


@pytest.fixture
def daemons() -> Iterator[list[Run]]:
    started: list[Run] = []
    yield started
    for run in started:
        if run.proc.poll() is None:
            run.kill()


def test_a_section_dropped_by_a_node_without_the_plugin_is_reported_and_put_back(
        proxmox: upstream.Upstream, tmp_path: Path, daemons: list[Run]) -> None:
    cfg = tmp_path / "storage.cfg"
    cfg.write_text(written_by_proxmox(proxmox, CFG, plugin=True))
    section = next(block + "\n" for block in cfg.read_text().split("\n\n")
                   if block.startswith("pvestord: thin1"))
    daemons.append(first := Run(tmp_path))
    first.wait_ready(TIMEOUT)
    first.wait_record("the configuration read", TIMEOUT, CONFIG="loaded", STORAGES="thin1")

    # The GUI edit on the node without the plugin: the section is gone for everyone.
    dropped = written_by_proxmox(proxmox, cfg.read_text(), plugin=False)
    assert "thin1" not in dropped and "thick1" in dropped and "local" in dropped
    rewrite(cfg, dropped)

    error = first.wait_record("the vanished storage", TIMEOUT, "ERROR", STORAGE="thin1",
                              STORAGE_STATE="vanished")
    assert urllib.parse.unquote(error.fields["SECTION"]) == section  # exactly as it was
    assert urllib.parse.unquote(error.fields["RESTORE"]) == "pvestord storage restore thin1 --apply"
    assert repr(section) in error.message and "pvestord storage restore thin1" in error.message
    # Still thin for the daemon: its VMs' LVs keep growing with the last settings.
    first.wait_record("re-read, thin1 kept", TIMEOUT, count=2, CONFIG="loaded", STORAGES="thin1")

    status_file = tmp_path / "state" / "status.json"
    view = published(status_file, '"vanished": 1')
    shown = cli("status", "--file", str(status_file), "--json")
    assert shown.returncode == 0, shown.stderr
    rows = json.loads(shown.stdout)["storages"]
    assert [(r["storage"], r["section"], r["vanished"] is not None) for r in rows] == [
        ("thin1", section, True)]
    text = cli("status", "--file", str(status_file))
    assert "STORAGE thin1 VANISHED from storage.cfg" in text.stdout
    assert "pvestord storage restore thin1 --apply" in text.stdout
    assert 'pvestord_storage_vanished{storage="thin1"} 1\n' in metrics.render(view)

    # A daemon started afterwards (a reboot, an upgrade) still knows, and says so.
    assert first.stop() == 0
    daemons.append(second := Run(tmp_path))
    second.wait_ready(TIMEOUT)
    second.wait_record("the vanished storage, again", TIMEOUT, "ERROR", STORAGE="thin1",
                       STORAGE_STATE="vanished")

    shown_only = cli("storage", "restore", "thin1", "--storage-config", str(cfg),
                     "--state-dir", str(tmp_path / "state" / "lib"))
    assert shown_only.returncode == 0, shown_only.stderr
    assert shown_only.stdout.startswith(section) and cfg.read_text() == dropped
    applied = cli("storage", "restore", "thin1", "--apply", "--storage-config", str(cfg),
                  "--state-dir", str(tmp_path / "state" / "lib"))
    assert applied.returncode == 0, applied.stderr
    second.wait_record("the storage back", TIMEOUT, STORAGE="thin1", STORAGE_STATE="back")
    view = published(status_file, '"vanished": null')
    assert 'pvestord_storage_vanished{storage="thin1"} 0\n' in metrics.render(view)
    # The real Proxmox, with the plugin, reads it as the storage it was.
    proxmox.write_storage_cfg(cfg.read_text())
    ids = proxmox.perl_json("print encode_json(PVE::Storage::config()->{ids});")
    assert ids["thin1"]["type"] == "pvestord"
    assert (ids["thin1"]["vgname"], ids["thin1"]["pvestord-chunksize"]) == ("vg_san1", "256M")
    assert set(ids) == {"local", "thin1", "thick1"}
    again = cli("storage", "restore", "thin1", "--apply", "--storage-config", str(cfg),
                "--state-dir", str(tmp_path / "state" / "lib"))
    assert again.returncode == 1 and "already" in again.stderr
    assert second.stop() == 0
