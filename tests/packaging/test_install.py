"""The package installs into clean Debian 12 and Debian 13 roots and its programs run there.

Each root is debootstrap's minbase with nothing but our package, what apt
pulls for it, and systemd (as on any Proxmox node); Debian 13's has its
lintian too (test_deb.py). Every test here runs in both (the
``installed_root`` fixture). No daemon is started: a chroot has no systemd
running (test_systemd_boot.py and the node-guest tier run the services).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.harness.debroot import chroot
from tests.packaging.conftest import pyproject_version

VERIFY_TIMEOUT = 60.0
UNIT_DIR = "usr/lib/systemd/system"
#: dpkg -i or --purge of our package in the root (py3compile included).
DPKG_TIMEOUT = 300.0


def test_installed(installed_root: Path) -> None:
    status = chroot(installed_root, ["dpkg-query", "-W", "-f=${Status} ${Version}", "pvestord"])
    assert status.stdout == f"install ok installed {pyproject_version()}"


@pytest.mark.parametrize("program", ["pvestord", "qmeventd-py"])
def test_help_and_version(installed_root: Path, program: str) -> None:
    assert chroot(installed_root, [program, "--help"]).stdout.startswith(f"usage: {program}")
    version = chroot(installed_root, [program, "--version"]).stdout.strip()
    assert version == f"{program} {pyproject_version()}"


def test_queue_commands(installed_root: Path) -> None:
    """The CLI works for real there: an empty queue, then one entry added and listed."""
    queue = ["pvestord", "--queue", "/tmp/q"]
    assert "queue is empty" in chroot(installed_root, [*queue, "queue", "list"]).stdout
    chroot(installed_root, [*queue, "queue", "add", "101:drive-scsi0"])
    entries = json.loads(chroot(installed_root, [*queue, "queue", "list", "--json"]).stdout)
    assert [(e["vmid"], e["block_node"]) for e in entries] == [(101, "drive-scsi0")], entries


def test_private_qemu_qmp(installed_root: Path) -> None:
    """The programs see the private qemu.qmp; other Python programs do not."""
    probe = ("import sys; sys.path.insert(1, '/usr/lib/pvestord'); "
             "from qemu.qmp import QMPClient; import qemu.qmp; print(qemu.qmp.__file__)")
    where = chroot(installed_root, ["python3", "-c", probe]).stdout.strip()
    assert where == "/usr/lib/pvestord/qemu/qmp/__init__.py"
    public = chroot(installed_root, ["python3", "-c", "import qemu.qmp"], check=False)
    assert public.returncode != 0 and "ModuleNotFoundError" in public.stderr
    for program in ("pvestord", "qmeventd-py"):
        text = (installed_root / "usr/bin" / program).read_text()
        assert 'sys.path.insert(1, "/usr/lib/pvestord")' in text
    # The daemons' own QMP modules import through the wrapper's path.
    loaded = chroot(installed_root, ["python3", "-c", probe.replace(
        "from qemu.qmp import QMPClient", "import pvestord.adapters.qmp, qmeventd_py.server")])
    assert loaded.stdout.strip() == "/usr/lib/pvestord/qemu/qmp/__init__.py"


def test_pyinotify_imports(installed_root: Path) -> None:
    """The daemon's folder watch needs pyinotify, which needs asyncore (a
    package of its own on Debian 13). Without it the daemon only says so and
    polls, so a missing dependency would pass unnoticed everywhere else."""
    chroot(installed_root, ["python3", "-c", "import pyinotify; pyinotify.AsyncioNotifier"])


def test_every_module_imports(installed_root: Path) -> None:
    """What the code imports at load time is installed (as the wrappers set the path)."""
    probe = ("import importlib, pkgutil, sys; sys.path.insert(1, '/usr/lib/pvestord')\n"
             "import pvestord, qmeventd_py\n"
             "for pkg in (pvestord, qmeventd_py):\n"
             "    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
             "        importlib.import_module(info.name)\n")
    chroot(installed_root, ["python3", "-c", probe])


def test_units_installed_enabled_and_verified(installed_root: Path) -> None:
    for unit in ("pvestord.service", "qmeventd-py.service"):
        assert (installed_root / UNIT_DIR / unit).is_file()
        link = installed_root / "etc/systemd/system/multi-user.target.wants" / unit
        assert link.is_symlink(), f"{unit} not enabled"
    # As installed, against the package's /usr/bin, by the root's own systemd
    # (this machine's older one rejects keys of Debian 13's own units).
    result = chroot(installed_root, ["systemd-analyze", "verify", "--man=no",
                                     f"/{UNIT_DIR}/pvestord.service",
                                     f"/{UNIT_DIR}/qmeventd-py.service"],
                    timeout=VERIFY_TIMEOUT, check=False, proc=True)
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), (
        f"exit {result.returncode}\n{result.stdout}{result.stderr}")


@pytest.mark.parametrize("unit", ["pvestord.service", "qmeventd-py.service"])
def test_unit_command_line_is_accepted(installed_root: Path, unit: str) -> None:
    """The installed program accepts the unit's ExecStart= arguments (asked for --help)."""
    text = (installed_root / UNIT_DIR / unit).read_text()
    exec_start = next(line.split("=", 1)[1] for line in text.splitlines()
                      if line.startswith("ExecStart="))
    result = chroot(installed_root, [*exec_start.split(), "--help"], check=False)
    assert result.returncode == 0, (
        f"{exec_start} --help: exit {result.returncode}\n{result.stderr}")


#: Proxmox's qmeventd.service comes with qemu-server, not installable here: a
#: stand-in unit file under the same name is what the postinst looks at.
_QMEVENTD_STANDIN = """\
[Unit]
Description=Stand-in for Proxmox's qmeventd (no qemu-server here)
[Service]
ExecStart=/bin/true
[Install]
WantedBy=multi-user.target
"""


def _enabled(root: Path, unit: str) -> str:
    return chroot(root, ["systemctl", "is-enabled", unit], check=False).stdout.strip()


def _dpkg(root: Path, deb: Path, *argv: str) -> None:
    shutil.copy2(deb, root / "tmp" / deb.name)
    try:
        chroot(root, ["dpkg", *argv, f"/tmp/{deb.name}"] if argv[0] == "-i"
               else ["dpkg", *argv], timeout=DPKG_TIMEOUT)
    finally:
        (root / "tmp" / deb.name).unlink()


def test_install_never_leaves_two_units_for_the_socket(installed_root: Path,
                                                       deb: Path) -> None:
    """dpkg's installs and upgrades on the three states of qmeventd.service
    (REVIEW.md 6); the root is put back as it was after."""
    root = installed_root
    standin = root / "etc/systemd/system/qmeventd.service"
    assert _enabled(root, "qmeventd-py.service") == "enabled"   # no qmeventd: enabled
    try:
        standin.write_text(_QMEVENTD_STANDIN)
        chroot(root, ["systemctl", "enable", "qmeventd.service"])
        # An upgrade of a node where both were enabled (as 0.1.0 left them).
        _dpkg(root, deb, "-i")
        assert _enabled(root, "qmeventd-py.service") == "disabled"
        assert _enabled(root, "qmeventd.service") == "enabled"
        # A first install beside an unmasked qmeventd: left disabled.
        _dpkg(root, deb, "--purge", "pvestord")
        _dpkg(root, deb, "-i")
        assert _enabled(root, "qmeventd-py.service") == "disabled"
        # The admin masked qmeventd first: a first install enables qmeventd-py.
        chroot(root, ["systemctl", "disable", "qmeventd.service"])
        standin.unlink()
        chroot(root, ["systemctl", "mask", "qmeventd.service"])
        _dpkg(root, deb, "--purge", "pvestord")
        _dpkg(root, deb, "-i")
        assert _enabled(root, "qmeventd-py.service") == "enabled"
        assert _enabled(root, "qmeventd.service") == "masked"
        # An upgrade keeps that.
        _dpkg(root, deb, "-i")
        assert _enabled(root, "qmeventd-py.service") == "enabled"
    finally:
        chroot(root, ["systemctl", "unmask", "qmeventd.service"], check=False)
        chroot(root, ["systemctl", "disable", "qmeventd.service"], check=False)
        standin.unlink(missing_ok=True)
    assert _enabled(root, "qmeventd-py.service") == "enabled"
