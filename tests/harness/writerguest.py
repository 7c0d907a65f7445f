"""A guest that writes one pattern through a real device: ``guest_writer.asm``.

A boot sector that writes with BIOS INT 13h (SeaBIOS -> virtio-blk -> QEMU's
block layer, so the device's ``werror`` policy applies, as for a real guest)
and reports on the isa-debugcon port: ``G``, a dot per call, ``S`` at the
end (``F`` and the status on a failed call). A Linux guest would take minutes
to boot inside an emulated node. Used by the ENOSPC tests of the node tier
and by the two-node tier's guest that fills its LV while migrating.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

MiB = 1024**2
ASM = Path(__file__).resolve().parent / "guest_writer.asm"
SECTOR = 512
#: Sectors per INT 13h call in guest_writer.asm.
CHUNK_SECTORS = 127


@dataclass(frozen=True)
class WriterGuest:
    """guest_writer.asm assembled for one write, and where its output goes."""

    boot_image: Path
    debugcon: Path
    bios_log: Path
    start: int
    length: int
    pattern: int

    @property
    def calls(self) -> int:
        return -(-self.length // SECTOR // CHUNK_SECTORS)

    @property
    def success(self) -> str:
        """What the debug port shows when every INT 13h call succeeded."""
        return "G" + "." * self.calls + "S"

    def args(self, data_node: str) -> list[str]:
        """Boot disk on IDE 0:0 (BIOS drive 80h), the data node on virtio-blk
        (drive 81h) with werror=enospc (qemu-server's default for disks),
        both debug ports to files."""
        return [
            "-m", "64",
            "-blockdev", f"driver=file,filename={self.boot_image},node-name=boot0",
            "-device", "ide-hd,drive=boot0,bus=ide.0,unit=0,bootindex=0,id=boot",
            "-device", f"virtio-blk-pci,drive={data_node},id=data0,"
                       "werror=enospc,rerror=report,share-rw=on",
            "-chardev", f"file,id=dbg,path={self.debugcon}",
            "-device", "isa-debugcon,iobase=0xe9,chardev=dbg",
            # SeaBIOS's own log: which ATA mode, which drives, for a failure.
            "-chardev", f"file,id=bios,path={self.bios_log}",
            "-device", "isa-debugcon,iobase=0x402,chardev=bios",
        ]

    def output(self) -> str:
        try:
            return self.debugcon.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_finished(self, timeout: float) -> str:
        """The debug port's text once the guest wrote its last byte."""
        deadline = time.monotonic() + timeout
        while True:
            out = self.output()
            if out.endswith("S") or "X" in out or ("F" in out and len(out) >= out.index("F") + 3):
                return out
            if time.monotonic() > deadline:
                raise TimeoutError(f"guest did not finish within {timeout} s; "
                                   f"debug port so far: {out!r}")
            time.sleep(0.2)


def build_writer(tmp: Path, logs: Path, name: str, *, start: int, length: int,
                 pattern: int, data_disk: int = 0x81,
                 gate: tuple[int, int] | None = None) -> WriterGuest:
    """Assemble the writer. ``gate`` (a byte offset on the data disk, a byte):
    the guest runs, reading that sector, and writes only once its first byte
    reads as the given one (the test writes it when the guest may go)."""
    nasm = shutil.which("nasm")
    if nasm is None:
        pytest.fail("nasm not found: scripts/install-deps installs it")
    assert start % SECTOR == 0 and length % SECTOR == 0
    gated = []
    if gate is not None:
        offset, byte = gate
        assert offset % SECTOR == 0 and 0 < byte < 256
        gated = [f"-DGATE_LBA={offset // SECTOR}", f"-DGATE_BYTE={byte:#x}"]
    boot_bin = tmp / f"{name}.bin"
    subprocess.run(  # noqa: S603 - argument list
        [nasm, "-f", "bin", f"-DSTART_LBA={start // SECTOR}",
         f"-DSECTORS={length // SECTOR}", f"-DPATTERN={pattern:#x}",
         f"-DDATA_DISK={data_disk:#x}", *gated, "-o", str(boot_bin),
         str(ASM)], check=True, timeout=60, capture_output=True)
    code = boot_bin.read_bytes()
    assert len(code) == SECTOR and code[-2:] == b"\x55\xaa"
    image = tmp / f"{name}.img"
    with image.open("wb") as f:
        f.write(code)
        f.truncate(1 * MiB)  # a disk SeaBIOS sizes like any other
    return WriterGuest(image, logs / f"{name}.debugcon", logs / f"{name}.seabios.log",
                       start, length, pattern)


