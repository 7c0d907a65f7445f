"""The fleet's drives made at once: one ``lvm`` shell per VG, qcow2s formatted as LVs appear.

An ``lvcreate`` is mostly LVM's start-up under emulation (bench.lvm_shell
measures the same for ``lvextend``), and it holds its VG's lock: lvcreates
of one VG queue behind each other however many run at once (20 LVs took
~48 s four at a time). One persistent shell per VG pays the start-up once;
the VGs' shells run side by side, and ``qemu-img create`` of the drives
already made runs beside the next lvcreate. The LVs are made with the
flags of :meth:`tests.harness.lvmbed.VG.create_lv`. Set-up only: nothing
here is measured.

Should a shell fail, its VG's remaining drives are made with one
``lvcreate`` each, and the set-up says so on the console.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence

from bench.lvm_shell import LvmShell, LvmShellError, quoted_config
from bench.together import map_together
from tests.harness.lvmbed import VG, block_device_size, qcow2_create, sh

#: ``qemu-img create`` runs at once: the guest has two CPUs, and the shells use them too.
FORMAT_PARALLEL = 2


def lv_name(vmid: int) -> str:
    return f"vm-{vmid}-disk-0.qcow2"


def shell_lvcreate(shell: LvmShell, vg: VG, lv: str, size: int) -> str:
    """Create ``vg/lv`` of ``size`` bytes in ``shell``; its device path.

    :raise LvmShellError: afterwards there is no device of that size (the
        shell's output says why).
    """
    output = shell.run(f"lvcreate --config {quoted_config()} -q -y --wipesignatures y "
                       f"-L {size}b -n {lv} {vg.name}")
    path = vg.lv_path(lv)
    try:
        made = block_device_size(path)
    except OSError as err:
        raise LvmShellError(f"lvcreate {vg.name}/{lv} in the shell left no device ({err}): "
                            f"{output}") from None
    if made != size:
        raise LvmShellError(f"lvcreate {vg.name}/{lv} in the shell made {made} bytes, not "
                            f"{size}: {output}")
    return path


def create_in_vg(vg: VG, vmids: Sequence[int], size: int,
                 made: Callable[[int, str], None]) -> None:
    """The LVs of ``vmids`` in ``vg``, one after another; ``made(vmid, path)`` as each exists."""
    remaining = list(vmids)
    shell = LvmShell()
    try:
        while remaining:
            made(remaining[0], shell_lvcreate(shell, vg, lv_name(remaining[0]), size))
            remaining.pop(0)
        return
    except (LvmShellError, OSError) as err:  # OSError: the shell's pipe closed
        print(f"bench: fleet: lvm shell failed in {vg.name} ({err}); one lvcreate each for "
              f"its other {len(remaining)} drives", flush=True)
    finally:
        shell.close()
    # The failed command may have made the LV all the same.
    sh("lvremove", "-q", "-f", f"{vg.name}/{lv_name(remaining[0])}", check=False)
    for vmid in remaining:
        made(vmid, vg.create_lv(lv_name(vmid), size))


def create_drives(drives: Sequence[tuple[VG, int]], size: int, virtual: int) -> dict[int, str]:
    """Each drive (VG, VMID): an LV of ``size`` bytes with a qcow2 of ``virtual``; VMID -> path."""
    by_vg: dict[str, tuple[VG, list[int]]] = {}
    for vg, vmid in drives:
        by_vg.setdefault(vg.name, (vg, []))[1].append(vmid)
    paths: dict[int, str] = {}
    formatting: list[concurrent.futures.Future[None]] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=FORMAT_PARALLEL) as formatter:

        def made(vmid: int, path: str) -> None:
            paths[vmid] = path
            formatting.append(formatter.submit(qcow2_create, path, virtual))

        map_together(lambda group: create_in_vg(group[0], group[1], size, made),
                     list(by_vg.values()))
    for future in formatting:
        future.result()
    return paths
