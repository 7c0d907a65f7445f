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
LVM_PROFILE = Path(__file__).resolve().parents[2] / "packaging" / "lvm" / "pvestord.profile"
LVM_PROFILE_DIR = Path("/etc/lvm/profile")


def _run(argv: list[str]) -> None:
    subprocess.run(argv, check=True, timeout=SETUP_TIMEOUT, stdin=subprocess.DEVNULL)  # noqa: S603


def prepare() -> None:
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
    (args.out / "inguest.started").write_text("booted\n")
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
