"""The Debian package: it builds, the lintian of Debian 12 and of Debian 13 find
no error and no warning, and it holds what we ship."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from pvestord.adapters.command import Completed, run
from tests.harness.debroot import chroot
from tests.packaging.conftest import SRC, Figures, pyproject_version

DPKG_TIMEOUT = 60.0
LINTIAN_TIMEOUT = 300.0
#: Every tag listed (Debian 13's lintian drops --no-tag-display-limit).
LINTIAN_ARGS = ("--tag-display-limit", "0")

EXPECTED_FILES = {
    "./usr/lib/systemd/system/pvestord.service",
    "./usr/lib/systemd/system/qmeventd-py.service",
    "./usr/bin/pvestord",
    "./usr/bin/qmeventd-py",
    "./etc/lvm/profile/pvestord.profile",
    "./usr/lib/python3/dist-packages/pvestord/__init__.py",
    "./usr/lib/python3/dist-packages/pvestord/adapters/lvmshell.py",
    "./usr/lib/python3/dist-packages/pvestord/cli/__init__.py",
    "./usr/lib/python3/dist-packages/qmeventd_py/__init__.py",
    "./usr/lib/python3/dist-packages/ha_placement/__init__.py",
    "./usr/lib/python3/dist-packages/ha_placement/manager.py",
    "./usr/lib/python3/dist-packages/ha_placement/py.typed",
    "./usr/lib/pvestord/qemu/qmp/__init__.py",
    "./usr/lib/pvestord/qemu/qmp/qmp_client.py",
    "./usr/lib/pvestord/qemu/qmp/protocol.py",
    "./usr/share/doc/pvestord/examples/storage.cfg.example",
    "./usr/share/doc/pvestord/operations.md",
    "./usr/share/doc/pvestord/copyright",
    # lintian's no-manual-page: one page per program (tests/test_manpage.py
    # keeps them true to the command lines).
    "./usr/share/man/man1/pvestord.1.gz",
    "./usr/share/man/man8/qmeventd-py.8.gz",
    # Proxmox notifications (pvestord.adapters.notify): the PVE::Notify bridge,
    # and the templates where PVE::Notify renders them from.
    "./usr/share/pvestord/notify.pl",
    *(f"./usr/share/pve-manager/templates/default/pvestord-{name}-{part}.txt.hbs"
      for name in ("low-space", "vm-paused", "vg-unhealthy", "storage-vanished")
      for part in ("subject", "body")),
}


def contents(deb: Path) -> dict[str, str]:
    """Path -> mode string, from `dpkg-deb -c`."""
    listing = run(["dpkg-deb", "-c", str(deb)], timeout=DPKG_TIMEOUT).stdout
    files = {}
    for line in listing.splitlines():
        fields = line.split()
        files[fields[5]] = fields[0]
    return files


def field(deb: Path, name: str) -> str:
    return run(["dpkg-deb", "-f", str(deb), name], timeout=DPKG_TIMEOUT).stdout.strip()


def control_script(deb: Path, name: str) -> str:
    return run(["sh", "-c", 'dpkg-deb --ctrl-tarfile "$1" | tar -xOf - "./$2"', "sh",
                str(deb), name], timeout=DPKG_TIMEOUT).stdout


def test_name_and_version(deb: Path) -> None:
    version = pyproject_version()
    assert deb.name == f"pvestord_{version}_all.deb"
    changelog = (SRC / "packaging/debian/changelog").read_text().splitlines()[0]
    assert changelog.startswith(f"pvestord ({version})"), (
        f"packaging/debian/changelog says {changelog!r}, pyproject.toml says {version}")
    assert field(deb, "Architecture") == "all"


def test_expected_files(deb: Path) -> None:
    files = contents(deb)
    missing = EXPECTED_FILES - files.keys()
    assert not missing, f"not in the package: {sorted(missing)}"
    assert files["./usr/bin/pvestord"].startswith("-rwxr-xr-x")
    assert files["./usr/bin/qmeventd-py"].startswith("-rwxr-xr-x")
    # Debian 13 has /lib, /bin, /sbin only as links into /usr: a package file
    # there is lintian's aliased-location error (and dpkg's bookkeeping of it
    # breaks when another package moves the same path).
    aliased = [f for f in files if re.match(r"\./(lib|lib64|bin|sbin)/", f)]
    assert not aliased, f"under an aliased location: {aliased}"


def test_private_qemu_qmp_is_the_lgpl_library_only(deb: Path) -> None:
    files = contents(deb)
    shipped = {Path(f).name for f in files if f.startswith("./usr/lib/pvestord/qemu/qmp/")}
    # GPL-2-only and tool modules stay out (docs/operations.md).
    assert not shipped & {"legacy.py", "qmp_shell.py", "qmp_tui.py"}
    # Private means private: nothing of qemu.qmp on the public module path.
    assert not [f for f in files if re.match(r"\./usr/lib/python3/dist-packages/qemu\b", f)]


def test_depends(deb: Path) -> None:
    depends = {d.strip().split()[0] for d in field(deb, "Depends").split(",")}
    assert {"python3-systemd", "python3-pyinotify", "lvm2", "qemu-utils", "procps"} <= depends
    assert not {d for d in depends if "qmp" in d}, "qemu.qmp is shipped, not depended on"


def test_depends_on_asyncore_where_python_lacks_it(deb: Path) -> None:
    """pyinotify imports asyncore, which left the standard library in Python
    3.12: Debian 13 (3.13) has it as python3-pyasyncore, Debian 12 (3.11) has
    no such package and needs none. dh_python3 writes the alternative from
    pyproject.toml's marker and py3dist-overrides; test_install.py checks both
    roots import pyinotify."""
    alternatives = [d.strip() for d in field(deb, "Depends").split(",")]
    assert "python3-pyasyncore | python3 (<< 3.12)" in alternatives, alternatives


def relations(deb: Path, name: str) -> dict[str, str]:
    """Package -> its version constraint ("" for none), from a relation field
    (each alternative of an ``a | b`` on its own)."""
    found = {}
    for item in re.split(r"[,|]", field(deb, name)):
        m = re.fullmatch(r"\s*([a-z0-9.+-]+)(?::[a-z0-9-]+)?\s*(?:\((.*)\))?\s*", item)
        assert m, f"{name}: cannot read {item!r}"
        found[m.group(1)] = (m.group(2) or "").strip()
    return found


def plugin_api() -> int:
    """The storage API level the plugin asks for (its ``api()``)."""
    text = (SRC / "packaging/perl/PVE/Storage/Custom/PvestordPlugin.pm").read_text()
    m = re.search(r"sub api \{\s*return (\d+);", text)
    assert m, "PvestordPlugin.pm has no api()"
    return int(m.group(1))


def test_older_proxmox_is_refused(deb: Path) -> None:
    """An older Proxmox node is refused by dpkg and apt, with the versions named
    (docs/operations.md): libpve-storage-perl 9.1.6 brought the plugin API 15
    that the plugin asks for, qemu-server 9.2.6 is the one the snapshot and
    event flows were checked against. Breaks, not Depends: the package still
    installs on plain Debian (no Proxmox there to be too old)."""
    assert plugin_api() == 15, "a new api(): find the libpve-storage-perl that brought it"
    breaks = relations(deb, "Breaks")
    assert breaks.get("libpve-storage-perl") == "<< 9.1.6", breaks
    assert breaks.get("qemu-server") == "<< 9.2.6", breaks
    depends = relations(deb, "Depends")
    assert not {"libpve-storage-perl", "qemu-server"} & depends.keys(), depends
    assert {"libpve-storage-perl", "qemu-server"} <= relations(deb, "Enhances").keys()
    # A PVE::Storage that Breaks cannot judge (not from a package, or a future
    # one that dropped API 15) is checked by the preinst, with the plugin's level.
    preinst = control_script(deb, "preinst")
    assert f"PLUGIN_API={plugin_api()}" in preinst


def test_units_enabled_not_started(deb: Path) -> None:
    """pvestord is enabled by debhelper; qmeventd-py only by our own check (it is
    installed --no-enable); which branch runs is tested where it runs
    (test_install.py, test_systemd_boot.py). Nothing is started: the only
    invocation of our units is an upgrade's try-restart."""
    postinst = control_script(deb, "postinst")
    assert "deb-systemd-helper enable 'pvestord.service'" in postinst
    assert "qmeventd_handed_over" in postinst
    ours = [line.split() for line in postinst.splitlines()
            if "deb-systemd-invoke" in line and ("pvestord" in line or "qmeventd-py" in line)]
    assert ours and all(words[1] == "try-restart" for words in ours), ours


def _lintian_tags(result: Completed, figures: Figures, label: str,
                  refused: tuple[str, ...] = ("E: ",)) -> None:
    tags = [line for line in result.stdout.splitlines() if re.match(r"[EWIXP]: ", line)]
    found = [line for line in tags if line.startswith(refused)]
    figures.values[label] = "; ".join(tags) or "clean"
    assert not found, "\n".join(found)
    # lintian exits non-zero on errors (and on a failure of its own): with none listed, 0.
    assert result.returncode == 0, result.stderr


def _changes(deb: Path) -> Path:
    changes = sorted(deb.parent.glob("pvestord_*.changes"))
    assert len(changes) == 1
    return changes[0]


def test_lintian_debian12_clean(deb: Path, figures: Figures) -> None:
    """This machine's lintian, Debian 12's: no warning either."""
    result = run(["lintian", *LINTIAN_ARGS, str(_changes(deb))],
                 timeout=LINTIAN_TIMEOUT, check=False)
    _lintian_tags(result, figures, "lintian (Debian 12)", refused=("E: ", "W: "))


@pytest.mark.parametrize("installed_root", ["trixie"], indirect=True)
def test_lintian_debian13_clean(deb: Path, installed_root: Path, figures: Figures) -> None:
    """Debian 13's lintian, run in the Debian 13 root (its cached root has it):
    Proxmox VE 9's Debian, so neither an error nor a warning is let pass."""
    inside = installed_root / "tmp/lintian"
    inside.mkdir()
    try:
        # The .changes with what it lists: the .deb and the .buildinfo.
        for path in deb.parent.glob("pvestord_*"):
            shutil.copy2(path, inside / path.name)
        result = chroot(installed_root, ["lintian", *LINTIAN_ARGS,
                                         f"/tmp/lintian/{_changes(deb).name}"],
                        timeout=LINTIAN_TIMEOUT, check=False)
    finally:
        shutil.rmtree(inside)
    _lintian_tags(result, figures, "lintian (Debian 13)", refused=("E: ", "W: "))
