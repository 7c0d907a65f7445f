"""The first thing that runs inside the node guest (see :mod:`tests.harness.nodeguest`).

Loads dm-mod and loop, gives loop-device backing files a tmpfs of their own
(the guest's root is the host's, read-only), then runs one of: a pytest
session, the demo, the benchmarks, or a plain command. Its exit status is the
guest's, which vng hands back to the host.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

#: Where loop-device backing files live inside the guest (tmpfs, gone at power-off).
SCRATCH = Path("/srv/pvestord-test")
SCRATCH_SIZE = "5G"
SETUP_TIMEOUT = 60
#: pvestord's LVM profile, put where the package puts it (/etc is the guest's own).
REPO = Path(__file__).resolve().parents[2]
LVM_PROFILE = REPO / "packaging" / "lvm" / "pvestord.profile"
LVM_PROFILE_DIR = Path("/etc/lvm/profile")
#: The 9p tag of the host's root shared again for a page cache (nodeguest.vng_argv).
CACHED_ROOT_TAG = "pvestord-host"
#: Where the host's root is mounted with a page cache.
CACHED_ROOT = Path("/run/pvestord-host")
#: Set when the guest boots a root of its own (tests.harness.noderoot): that
#: root's path on the host, under which its trees are found in the cached view.
GUEST_ROOT_ENV = "PVESTORD_GUEST_ROOT"
#: On a root of its own, where vng mounts the writable folder, and the
#: variable naming its path on the host, where it is bound before anything
#: is written there (a node's --out may be a folder inside it).
GUEST_OUT_MOUNT = Path("/tmp/pvestord-out")
GUEST_OUT_ENV = "PVESTORD_GUEST_OUT"
#: Written in --out as the guest starts the command: the host tells a guest
#: that ran nothing (booted again, nodeguest.BOOT_ATTEMPTS) from one that ran.
STARTED_MARKER = "inguest.started"
#: Read-only trees of the guest's root that tests read all the time: programs,
#: libraries, Python and Perl modules, QEMU's firmware, the trixie bed's venv.
SYSTEM_TREES = tuple(Path(p) for p in (
    "/usr/bin", "/usr/sbin", "/usr/libexec", "/usr/lib/x86_64-linux-gnu", "/usr/lib/python3",
    f"/usr/lib/python3.{sys.version_info.minor}", "/usr/share/perl", "/usr/share/perl5",
    "/usr/share/qemu", "/usr/share/seabios", "/opt/pvestord-venv"))
#: The repository's code, its venv and Proxmox's sources beside it.
REPO_TREES = tuple(REPO / p for p in (".venv", "pvestord", "qmeventd_py", "tests", "bench",
                                      "../shared"))


def _run(argv: list[str]) -> None:
    subprocess.run(argv, check=True, timeout=SETUP_TIMEOUT, stdin=subprocess.DEVNULL)  # noqa: S603


def cache_host_trees() -> None:
    """Serve the trees every test process reads from a page-cached view.

    vng mounts the host's root over 9p without a cache, so each stat and read
    is a round trip through the emulated virtio queue: a Python process
    spent half of its start-up (3 to 4 s of 8 under nested TCG) on them, and
    each test starts a dozen (daemons, CLI calls, qemu-io). The same root,
    shared again by :func:`tests.harness.nodeguest.vng_argv`, is mounted here
    with ``cache=loose`` and bound over the trees that hold programs and
    modules. Nothing in them changes while the guest runs, so a cache that
    never asks the host again is safe; the repository's ``out`` folder,
    written by both sides, stays on its own uncached share.
    """
    if not any(tag.read_bytes().rstrip(b"\0").decode() == CACHED_ROOT_TAG
               for tag in Path("/sys/bus/virtio/drivers/9pnet_virtio").glob("*/mount_tag")):
        return
    CACHED_ROOT.mkdir(parents=True, exist_ok=True)
    _run(["mount", "-t", "9p", "-o", "trans=virtio,version=9p2000.L,cache=loose,ro,"
          "msize=512000", CACHED_ROOT_TAG, str(CACHED_ROOT)])
    # The guest's own root, where it has one, is a folder of the host's.
    guest_root = CACHED_ROOT / os.environ.get(GUEST_ROOT_ENV, "/").lstrip("/")
    trees = [(guest_root / t.relative_to("/"), t) for t in SYSTEM_TREES]
    trees += [(CACHED_ROOT / t.resolve().relative_to("/"), t.resolve()) for t in REPO_TREES]
    for cached, tree in trees:
        if tree.is_dir() and cached.is_dir():
            _run(["mount", "--bind", str(cached), str(tree)])


def prepare() -> None:
    cache_host_trees()
    _run(["modprobe", "dm-mod"])
    _run(["modprobe", "loop"])
    SCRATCH.mkdir(parents=True, exist_ok=True)
    _run(["mount", "-t", "tmpfs", "-o", f"size={SCRATCH_SIZE},mode=0755", "pvestord-test",
          str(SCRATCH)])
    LVM_PROFILE_DIR.mkdir(parents=True, exist_ok=True)
    shutil.copy(LVM_PROFILE, LVM_PROFILE_DIR / LVM_PROFILE.name)
    # vng hands the guest's init some virtio ports; LVM warns about each on every command.
    os.environ["LVM_SUPPRESS_FD_WARNINGS"] = "1"
    # The repository is read-only in here.
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    os.environ["PVESTORD_TEST_SCRATCH"] = str(SCRATCH)
    os.environ["PVESTORD_IN_NODE_GUEST"] = "1"
    venv_bin = str(Path(sys.executable).parent)
    os.environ["PATH"] = f"{venv_bin}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"


def main() -> int:
    parser = argparse.ArgumentParser(prog="inguest")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("what", choices=["pytest", "demo", "bench", "exec"])
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if os.environ.get(GUEST_OUT_ENV) and GUEST_OUT_MOUNT.is_dir():
        _run(["mount", "--bind", str(GUEST_OUT_MOUNT), os.environ[GUEST_OUT_ENV]])
    (args.out / STARTED_MARKER).write_text("booted\n")
    prepare()
    os.environ["PVESTORD_TEST_OUT"] = str(args.out)
    python = sys.executable
    argv: list[str]
    match args.what:
        case "pytest":
            argv = [python, "-m", "pytest", *args.rest]
        case "demo":
            argv = [python, "-m", "tests.harness.demo", *args.rest]
        case "bench":
            argv = [python, "-m", "bench.run", "--out", str(args.out), *args.rest]
        case _:
            argv = list(args.rest)
    # No timeout here: the host side bounds the whole guest run.
    return subprocess.call(argv, stdin=subprocess.DEVNULL)  # noqa: S603


if __name__ == "__main__":
    sys.exit(main())
