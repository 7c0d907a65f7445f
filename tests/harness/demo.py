"""``make demo``: a thin disk growing live under a writing VM, in the node guest.

Real everything: a loop-device VG, qmeventd-py and pvestord as processes, a
QEMU whose 8 GiB qcow2 disk lives on a 256 MiB LV, and a writer going through
QEMU's block layer. Each extension pvestord makes is printed as it lands; at
the end every byte is read back and ``qemu-img check`` runs.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from tests.harness.daemonlog import EXTENDED
from tests.harness.daemons import NodeBed, ThinStorageSpec, daemons
from tests.harness.lvmbed import GiB, MiB, loop_vg, qcow2_check, qcow2_create
from tests.harness.polling import wait_until
from tests.harness.qemu import Pve9Disk, QemuVM

VMID = 100
#: Small writes, as a guest's are: each crosses at most one threshold.
WRITE = 4 * MiB
#: Per write and per verify; generous, the node guest is emulated.
IO_TIMEOUT = 180.0
TOTAL = 2 * GiB
#: The emulated node writes about 40 MiB/s through the NBD session (2 GiB in
#: 51 s); on a faster machine the demo paces the writer so each chunk's
#: extension has time to land (see bench/ for the limits).
PACE = 48 * MiB


def say(text: str) -> None:
    print(f"demo: {text}", flush=True)


def main() -> int:
    out = Path(os.environ.get("PVESTORD_TEST_OUT", tempfile.mkdtemp()))
    for old in ("pvestord.log", "qmeventd.log", "qemu.log"):
        (out / old).unlink(missing_ok=True)  # daemons append; show this run's lines only
    with loop_vg(4 * GiB, prefix="demo") as vg, tempfile.TemporaryDirectory() as tmp:
        bed = NodeBed(Path(tmp), [ThinStorageSpec("san", vg.name, chunksize="256M",
                                                  chunk_percentage=0.5)], logs_dir=out)
        lv = f"vm-{VMID}-disk-0.qcow2"
        path = vg.create_lv(lv, 256 * MiB)
        qcow2_create(path, 8 * GiB)
        # Attached as Proxmox VE 9 does: throttle over qcow2 over host_device.
        disk = Pve9Disk.for_volume(path, f"san:{lv}")
        say(f"VG {vg.name} on a 4 GiB loop device; LV {lv} is 256 MiB under an 8 GiB qcow2")
        say("storage 'san': chunksize 256M, chunk-percentage 0.5 (threshold = LV size - 128M)")
        with daemons(bed) as (_, pvestord), QemuVM(
                VMID, bed.run_dir, disks=[disk],
                event_socket=bed.event_socket, log_path=out / "qemu.log") as vm:
            wait_until(lambda: vm.named_node(disk.file_block_node)["write_threshold"] > 0, 30,
                       "the first threshold")
            say("qmeventd-py and pvestord running; threshold armed at "
                f"{vm.named_node(disk.file_block_node)['write_threshold'] // MiB} MiB")
            say(f"writing {TOTAL // GiB} GiB in {WRITE // MiB} MiB writes through QEMU ...")
            seen = 0
            failed = 0
            began = time.monotonic()
            with vm.io_session() as io:
                for offset in range(0, TOTAL, WRITE):
                    if not io.write_pattern(disk.block_node, offset, WRITE, 0xC5, check=False,
                                            timeout=IO_TIMEOUT).ok:
                        failed += 1
                    text = pvestord.log_text()
                    for m in EXTENDED.finditer(text, seen):
                        say(f"  extended {m.group(2):>10} -> {m.group(3):>10}  in {m.group(4)} ms"
                            f"   (guest has written {(offset + WRITE) // MiB} MiB)")
                    seen = len(text)
                    ahead = (offset + WRITE) / PACE - (time.monotonic() - began)
                    if ahead > 0:
                        time.sleep(ahead)
            wait_until(lambda: bed.entries() == [], 60, "the queue to drain")
            for m in EXTENDED.finditer(pvestord.log_text(), seen):
                say(f"  extended {m.group(2):>10} -> {m.group(3):>10}  in {m.group(4)} ms")
            say(f"wrote {TOTAL // MiB} MiB in {time.monotonic() - began:.1f} s, "
                f"{failed} failed writes")
            say("verifying every byte ...")
            with vm.io_session() as io:
                good = all(io.read_verify(disk.block_node, o, 64 * MiB, 0xC5, timeout=IO_TIMEOUT)
                           for o in range(0, TOTAL, 64 * MiB))
            say(f"LV is now {vg.lv_size(lv) // MiB} MiB; threshold at "
                f"{vm.named_node(disk.file_block_node)['write_threshold'] // MiB} MiB; data "
                + ("verified" if good else "MISMATCH"))
        check = qcow2_check(path)
        say(f"qemu-img check: {'clean' if check['exit'] == 0 else check}")
        say(f"logs: {out}")
        return 0 if good and failed == 0 and check["exit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
