"""Real LVM on loop devices, for the node-guest tier, the demo and the benchmarks.

Each :func:`loop_vg` is a fresh volume group with a unique name on its own
sparse backing file (on the guest's scratch tmpfs), removed afterwards even
when the test failed. Commands are run with argument lists and timeouts; a
failure says the command, its exit status and stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

LVM_TIMEOUT = 60.0
MiB = 1024 * 1024
GiB = 1024 * MiB


def scratch_dir() -> Path:
    path = Path(os.environ.get("PVESTORD_TEST_SCRATCH", "/srv/pvestord-test"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def sh(*argv: str, timeout: float = LVM_TIMEOUT, check: bool = True) -> str:
    """Run a command; return stdout. Raise with the command and stderr on failure."""
    proc = subprocess.run(  # noqa: S603 - argument list
        list(argv), capture_output=True, text=True, timeout=timeout,
        stdin=subprocess.DEVNULL, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def block_device_size(path: str) -> int:
    """A block device's size, by an lseek: tests poll it, and ``blockdev``
    would be a process each time under the node guest's emulation."""
    with open(path, "rb") as device:
        return device.seek(0, os.SEEK_END)


@dataclass
class LoopPV:
    backing: Path
    device: str


@dataclass
class VG:
    name: str
    pvs: list[LoopPV] = field(default_factory=list)

    def lv_path(self, lv: str) -> str:
        return f"/dev/{self.name}/{lv}"

    def lv_size(self, lv: str) -> int:
        out = sh("lvs", "--reportformat", "json", "--units", "b", "--nosuffix", "-o",
                 "lv_size", f"{self.name}/{lv}")
        return int(json.loads(out)["report"][0]["lv"][0]["lv_size"])

    def lv_tags(self, lv: str) -> set[str]:
        out = sh("lvs", "--reportformat", "json", "-o", "lv_tags", f"{self.name}/{lv}")
        return set(filter(None, json.loads(out)["report"][0]["lv"][0]["lv_tags"].split(",")))

    def device_size(self, lv: str) -> int:
        """The size device-mapper gives the LV now (what QEMU sees)."""
        return block_device_size(self.lv_path(lv))

    def extent_size(self) -> int:
        out = sh("vgs", "--reportformat", "json", "--units", "b", "--nosuffix", "-o",
                 "vg_extent_size", self.name)
        return int(json.loads(out)["report"][0]["vg"][0]["vg_extent_size"])

    def free(self) -> int:
        out = sh("vgs", "--reportformat", "json", "--units", "b", "--nosuffix", "-o",
                 "vg_free", self.name)
        return int(json.loads(out)["report"][0]["vg"][0]["vg_free"])

    def create_lv(self, lv: str, size: int) -> str:
        sh("lvcreate", "-q", "-y", "--wipesignatures", "y", "-L", f"{size}b", "-n", lv,
           self.name)
        return self.lv_path(lv)

    def add_pv(self, size: int) -> LoopPV:
        pv = _loop_pv(size)
        sh("pvcreate", "-q", pv.device)
        sh("vgextend", "-q", self.name, pv.device)
        self.pvs.append(pv)
        return pv


def _loop_pv(size: int) -> LoopPV:
    backing = scratch_dir() / f"pv-{secrets.token_hex(4)}.img"
    with backing.open("wb") as f:
        f.truncate(size)
    device = sh("losetup", "--find", "--show", str(backing)).strip()
    return LoopPV(backing, device)


@contextlib.contextmanager
def loop_vg(size: int = 4 * GiB, *, prefix: str = "pvt", extent_size: str = "4m") -> Iterator[VG]:
    """A volume group of ``size`` on one loop device, removed afterwards."""
    vg = VG(f"{prefix}{secrets.token_hex(3)}")
    pv = _loop_pv(size)
    vg.pvs.append(pv)
    try:
        sh("pvcreate", "-q", pv.device)
        sh("vgcreate", "-q", "-s", extent_size, vg.name, pv.device)
        yield vg
    finally:
        sh("vgremove", "-q", "-f", vg.name, check=False)
        for p in vg.pvs:
            sh("pvremove", "-q", "-ff", "-y", p.device, check=False)
            sh("losetup", "-d", p.device, check=False)
            p.backing.unlink(missing_ok=True)


def qcow2_create(path: str, virtual_size: int, *, options: str = "") -> None:
    argv = ["qemu-img", "create", "-q", "-f", "qcow2"]
    if options:
        argv += ["-o", options]
    sh(*argv, path, str(virtual_size))


def measured_maximum(virtual: int, extent: int) -> int:
    """What pvestord lets a qcow2 of ``virtual`` bytes grow to: ``qemu-img
    measure``'s fully-allocated size in whole extents."""
    out = sh("qemu-img", "measure", "--output=json", "-O", "qcow2", "--size", str(virtual))
    return -(-int(json.loads(out)["fully-allocated"]) // extent) * extent


def qcow2_check(path: str) -> dict[str, object]:
    """``qemu-img check`` as JSON; exit 3 (leaks only) is not an error here."""
    proc = subprocess.run(  # noqa: S603
        ["qemu-img", "check", "--output=json", path], capture_output=True, text=True,
        timeout=LVM_TIMEOUT, stdin=subprocess.DEVNULL, check=False)
    if proc.returncode not in (0, 3):
        raise RuntimeError(f"qemu-img check {path} exited {proc.returncode}: "
                           f"{proc.stdout}{proc.stderr}")
    result: dict[str, object] = json.loads(proc.stdout)
    result["exit"] = proc.returncode
    return result


def image_end_offset(path: str) -> int:
    """Where the qcow2 image on ``path`` ends (``qemu-img check``'s image-end-offset)."""
    return int(str(qcow2_check(path)["image-end-offset"]))
