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
    (absent, unmasked, masked): never are both units enabled, which would leave
    the event socket to systemd's conflict resolution at the next boot; the
    root is put back as it was after."""
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
        # (Masked after the purge: a removal lifts systemctl's mask, postrm.)
        chroot(root, ["systemctl", "disable", "qmeventd.service"])
        standin.unlink()
        _dpkg(root, deb, "--purge", "pvestord")
        chroot(root, ["systemctl", "mask", "qmeventd.service"])
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


#: Every Proxmox daemon that loads storage plugins when it starts
#: (docs/operations.md): the postinst reloads those that run.
PROXMOX_DAEMONS = ("pvedaemon.service", "pveproxy.service", "pvestatd.service",
                   "pvescheduler.service", "pve-ha-crm.service", "pve-ha-lrm.service")
#: A stand-in for systemctl, first on the postinst's PATH: the root has no
#: systemd running (and no Proxmox). It records every call and reports the
#: units named in ``active`` as running, every other one as not.
_SYSTEMCTL_STANDIN = """\
#!/bin/sh
# Stand-in for systemctl (tests/packaging/test_install.py), not systemd's.
dir=/tmp/standin-systemctl
echo "$*" >>"$dir/calls"
case " $* " in
*" is-active "*)
	for arg; do
		case "$arg" in *.service) grep -qxF "$arg" "$dir/active" && exit 0 ;; esac
	done
	exit 3 ;;
*" is-enabled "*) exit 1 ;;
esac
exit 0
"""


def test_postinst_reloads_the_proxmox_daemons_that_run(installed_root: Path) -> None:
    """Every daemon that loads storage plugins learns ours at configure, the
    scheduler and HA services too; one that is not running is
    left alone, and the postinst says which it reloaded."""
    root = installed_root
    standin = root / "tmp/standin-systemctl"
    running = ("pvedaemon.service", "pvestatd.service", "pvescheduler.service",
               "pve-ha-lrm.service")
    systemd_dir = root / "run/systemd/system"
    made_systemd_dir = not systemd_dir.exists()
    standin.mkdir()
    try:
        (standin / "systemctl").write_text(_SYSTEMCTL_STANDIN)
        (standin / "systemctl").chmod(0o755)
        (standin / "active").write_text("".join(f"{u}\n" for u in running))
        systemd_dir.mkdir(parents=True, exist_ok=True)
        done = chroot(root, ["env", "PATH=/tmp/standin-systemctl:/usr/sbin:/usr/bin:/sbin:/bin",
                             "/var/lib/dpkg/info/pvestord.postinst", "configure",
                             pyproject_version()])
        calls = (standin / "calls").read_text().splitlines()
    finally:
        shutil.rmtree(standin)
        if made_systemd_dir:
            systemd_dir.rmdir()
    touched = [c.split()[-1] for c in calls
               if c.split()[0] in ("reload-or-try-restart", "try-reload-or-restart")]
    assert touched == list(running), calls
    assert not [c for c in calls for u in PROXMOX_DAEMONS if u not in running
                and u in c.split() and "is-active" not in c.split()], calls
    said = [line for line in done.stdout.splitlines() if "reloaded" in line]
    assert said and all(u.removesuffix(".service") in said[0] for u in running), done.stdout


def _fake_pve_storage(root: Path, apiver: int, apiage: int) -> Path:
    """A PVE/Storage.pm declaring an API window, as pve-storage's does; no
    Proxmox package is installable here."""
    path = root / "usr/share/perl5/PVE/Storage.pm"
    path.write_text(f"package PVE::Storage;\nuse constant APIVER => {apiver};\n"
                    f"use constant APIAGE => {apiage};\n1;\n")
    return path


@pytest.mark.parametrize(("apiver", "apiage", "says"),
                         [(14, 5, "libpve-storage-perl 9.1.6 or newer"),
                          (22, 6, "no longer offers")])
def test_preinst_refuses_a_storage_api_without_the_plugins(
        installed_root: Path, deb: Path, apiver: int, apiage: int, says: str) -> None:
    """Where PVE::Storage would refuse the plugin (an API older than 15, or
    one that dropped 15), dpkg refuses the package before unpacking it, with
    the reason; the storage type never silently disappears."""
    root = installed_root
    fake = _fake_pve_storage(root, apiver, apiage)
    shutil.copy2(deb, root / "tmp" / deb.name)
    try:
        done = chroot(root, ["dpkg", "-i", f"/tmp/{deb.name}"], timeout=DPKG_TIMEOUT,
                      check=False)
    finally:
        fake.unlink()
        (root / "tmp" / deb.name).unlink()
    assert done.returncode != 0, done.stdout
    assert says in done.stdout + done.stderr, done.stdout + done.stderr
    assert f"APIVER {apiver}" in done.stdout + done.stderr
    # Refused before anything was unpacked: the installed package is as it was.
    status = chroot(root, ["dpkg-query", "-W", "-f=${Status}", "pvestord"])
    assert status.stdout == "install ok installed"
