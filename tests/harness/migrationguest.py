"""The two-node tier's migration guest: one VM with a thin drive on the shared
VG, started on node A, and what the migration tests do to it (a target QEMU
on B, ``migrate`` on A, qemu-server's config lock, the migration hint).

:class:`Guest` is built by the ``guest`` fixture (tests/integration/cluster/conftest.py),
which waits for its threshold to be armed on A and, afterwards, stops it,
checks its image and removes its LV.
"""

from __future__ import annotations

import itertools

from tests.harness.polling import wait_until
from tests.harness.twonode import (
    Cluster,
    MiB,
    Node,
    create_thin_volume,
    file_node,
    fmt_node,
    launch_vm,
    lv_size,
    lvm,
    migration_status,
    pvestord_cli,
    run_status,
    vm_lv,
)

INITIAL, CHUNK = 64 * MiB, 32 * MiB
EXTEND_TIMEOUT = 120.0
MIGRATE_TIMEOUT = 120.0
PORT = 4444
#: A fresh VM id for each guest of the tier, so that no two tests share one.
vmids = itertools.count(301)


def threshold(node: Node, vmid: int) -> int:
    return int(node.vm(vmid, "named_node", file_node(vmid))["write_threshold"])


def write(node: Node, vmid: int, start: int, end: int, pattern: int) -> None:
    r = node.vm(vmid, "write_pattern", fmt_node(vmid), start, end - start, pattern, check=False)
    assert r["ok"], f"{node.name}: write {start}+{end - start}: {r['error']}"


class Guest:
    """One VM with a thin drive on the shared VG, started on A."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.vmid = next(vmids)
        self.lv = vm_lv(self.vmid)
        self.path = create_thin_volume(cluster.a, cluster.vg, self.vmid, size=INITIAL)
        self.on = cluster.a
        launch_vm(cluster.a, self.vmid, self.path)

    def size(self) -> int:
        return lv_size(self.cluster.a, self.cluster.vg, self.lv)

    def activate_on_b(self) -> None:
        lvm(self.cluster.b, "lvchange", "-ay", f"{self.cluster.vg}/{self.lv}")

    def hint(self, phase: str) -> None:
        for node, role in ((self.cluster.a, "outgoing"), (self.cluster.b, "incoming")):
            pvestord_cli(self.cluster, node, "migration", phase, str(self.vmid), "--role", role)

    def start_migration(self, *, pause_before_switchover: bool = False) -> None:
        """B's target QEMU, then ``migrate`` on A (qemu-server's order)."""
        a, b = self.cluster.a, self.cluster.b
        launch_vm(b, self.vmid, self.path, incoming=f"tcp:0:{PORT}")
        if pause_before_switchover:
            a.vm(self.vmid, "qmp", "migrate-set-capabilities", {"capabilities": [
                {"capability": "pause-before-switchover", "state": True}]})
        a.vm(self.vmid, "qmp", "migrate", {"uri": f"tcp:{b.addr}:{PORT}"})

    def finish_migration(self) -> None:
        a, b = self.cluster.a, self.cluster.b
        wait_until(lambda: migration_status(a, self.vmid) in ("completed", "failed"),
                   MIGRATE_TIMEOUT, "migration finished on A")
        assert migration_status(a, self.vmid) == "completed"
        wait_until(lambda: run_status(b, self.vmid) == "running", 60, "VM running on B")
        a.call("vm_shutdown", vmid=self.vmid)
        lvm(a, "lvchange", "-an", f"{self.cluster.vg}/{self.lv}")
        self.on = b

    def config_lock(self, lock: str | None) -> None:
        """Write the VM's config on A as qemu-server would, with ``lock: LOCK``
        in its main section (None: without one, as ``qm unlock`` leaves it)."""
        config = self.cluster.pve / "nodes" / self.cluster.a.name / "qemu-server" / \
            f"{self.vmid}.conf"
        config.parent.mkdir(parents=True, exist_ok=True)
        locked = f"lock: {lock}\n" if lock else ""
        config.write_text(f"cores: 1\n{locked}memory: 512\n"
                          f"scsi0: thin:{self.lv},size={INITIAL}\n")

    def stop(self) -> None:
        for node in self.cluster.nodes:
            node.call("vm_shutdown", vmid=self.vmid)
