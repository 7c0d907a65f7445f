"""The Debian 13 root the node guest can boot: Proxmox VE 9's userland.

Proxmox VE 9 is Debian 13 (trixie): QEMU 10, lvm2 2.03.31, perl 5.40,
Python 3.13. The node guest otherwise boots a Debian kernel over this
machine's own root, so every LVM, QEMU and Perl behaviour it shows is the
host's release. This module makes, from Debian's packages, a trixie root
with its own kernel and modules, the programs the tests drive and a venv of
its Python with the test dependencies; :mod:`tests.harness.nodeguest` boots
it with ``--bed trixie``.

The root is cached under ``/var/cache/pvestord-test`` (keyed by its base
root, package list and venv requirements: a second run builds nothing) and
shared read-only with the guest, which sees the repository at the same path
as the host. The repository itself is not installed into the venv: a
``.pth`` file and the two console scripts name the checkout that boots the
root, written before each boot (:func:`point_at`), so one cached root
serves any checkout. The ``.pth`` file reads the checkout from the guest's
environment (:data:`CHECKOUT_ENV`, set at boot) before the path it was
written with: guests of several checkouts (git worktrees) may run on the one
root at once, and the last boot's file must not send the others' Python to
a checkout their guest does not mount.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from pvestord.adapters.command import run
from tests.harness import debroot

RELEASE = debroot.TRIXIE

#: What the guest runs: its kernel and module tools, LVM, QEMU and qemu-img,
#: Python with the two Debian-packaged dependencies that carry C code, Perl
#: with the CPAN modules Proxmox's storage code loads (tests/harness/pvestorage),
#: nasm for the real-mode writer guest, and the tools the harness calls.
PACKAGES = (
    "linux-image-amd64", "kmod", "udev", "iproute2", "procps", "util-linux", "mount",
    "lvm2", "dmsetup", "qemu-system-x86", "qemu-utils", "seabios",
    "python3", "python3-venv", "python3-setuptools", "python3-systemd", "python3-pyinotify",
    "nasm",
    "perl", "libanyevent-perl", "libclone-perl", "libdevel-cycle-perl",
    "libencode-locale-perl", "libfile-chdir-perl", "libfilesys-df-perl",
    "libhttp-message-perl", "libjson-perl", "liblinux-inotify2-perl", "libnet-dbus-perl",
    "libnet-ip-perl", "libnet-ssleay-perl", "libnetaddr-ip-perl", "libposix-strptime-perl",
    "libstring-shellquote-perl", "libtimedate-perl", "liburi-perl", "libwww-perl",
    "libxml-libxml-perl",
)

#: The venv inside the root; system site-packages give it python3-systemd and
#: python3-pyinotify as Debian builds them for its Python.
VENV = Path("/opt/pvestord-venv")
#: The pure-Python requirements pip adds: the project's own and its test tier's
#: (pyproject.toml), less what the guest never runs (ruff, mypy, virtme-ng).
PIP_REQUIREMENTS = (
    "qemu.qmp>=0.0.3", "pyasyncore>=1.0.2",
    "pytest>=7.2", "pytest-asyncio>=0.21", "pytest-timeout>=2.1", "hypothesis>=6.70",
    "prometheus-client>=0.16",
)
#: pip inside the root: downloads and installs a few pure-Python wheels.
PIP_TIMEOUT = 900.0

#: The console scripts of pyproject.toml's [project.scripts].
CONSOLE_SCRIPTS = {"pvestord": "pvestord.cli", "qmeventd-py": "qmeventd_py.server"}
#: The .pth file that puts the booting checkout on the venv's path.
CHECKOUT_PTH = "pvestord-checkout.pth"
#: The guest's environment variable naming the checkout it booted from.
CHECKOUT_ENV = "PVESTORD_CHECKOUT"


def _make_venv(root: Path) -> None:
    """The venv, from wheels the host's pip fetches: the host's pip has this
    machine's index settings and certificates, a bare root has neither."""
    wheels = debroot.CACHE / "wheels-trixie"
    run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
         "--only-binary=:all:", "--python-version", "3.13", "-d", str(wheels),
         *PIP_REQUIREMENTS], timeout=PIP_TIMEOUT)
    inside = root / "tmp" / "wheels"
    shutil.copytree(wheels, inside, dirs_exist_ok=True)
    debroot.chroot(root, ["python3", "-m", "venv", "--system-site-packages", str(VENV)])
    debroot.chroot(root, [str(VENV / "bin/pip"), "install", "-q", "--disable-pip-version-check",
                          "--no-index", "--find-links", "/tmp/wheels", *PIP_REQUIREMENTS],
                   timeout=PIP_TIMEOUT)
    shutil.rmtree(inside)


def node_root() -> tuple[Path, float | None]:
    """The cached trixie node root, made if missing; seconds it took (None: cached)."""
    return debroot.derived_root(RELEASE, "node", PACKAGES,
                                {"venv": str(VENV), "pip": sorted(PIP_REQUIREMENTS)},
                                finish=_make_venv)


def kernel(root: Path) -> Path:
    """The root's own kernel: its modules (dm-mod, loop) are in the root."""
    kernels = sorted((root / "boot").glob("vmlinuz-*-amd64"))
    if not kernels:
        raise RuntimeError(f"no kernel in {root}/boot: linux-image-amd64 is in PACKAGES")
    return kernels[-1]


def site_packages(root: Path) -> Path:
    found = sorted((root / VENV.relative_to("/") / "lib").glob("python3.*/site-packages"))
    if not found:
        raise RuntimeError(f"no venv at {VENV} in {root}")
    return found[-1]


def point_at(root: Path, checkout: Path) -> None:
    """Make the root's venv run ``checkout``'s code: its ``.pth`` and console
    scripts, and the folders the guest mounts the checkout (and what the
    tests read beside it) on. Written before each boot, and only when they
    differ, so the cached root stays as it was for the same checkout."""
    # A .pth line that starts with "import" is run: the guest's own checkout first.
    _write_if_changed(site_packages(root) / CHECKOUT_PTH,
                      f"import os, sys; sys.path.append(os.environ.get({CHECKOUT_ENV!r})"
                      f" or {str(checkout)!r})\n")
    for name, module in CONSOLE_SCRIPTS.items():
        script = root / VENV.relative_to("/") / "bin" / name
        _write_if_changed(script, f"#!{VENV}/bin/python\nimport sys\n"
                          f"from {module} import main\nsys.exit(main())\n")
        script.chmod(0o755)
    for folder in (checkout, checkout.parent / "shared"):
        (root / folder.relative_to("/")).mkdir(parents=True, exist_ok=True)


def _write_if_changed(path: Path, text: str) -> None:
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


if __name__ == "__main__":
    path, seconds = node_root()
    print(f"{path}: " + ("cached" if seconds is None else f"made in {seconds:.0f} s"))
    sys.exit(0)
