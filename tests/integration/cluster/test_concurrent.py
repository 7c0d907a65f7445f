"""Two nodes extending LVs of one shared VG at the same moment lose nothing.

Without a cluster-wide lock, two ``lvextend``s on one VG from two nodes both
succeed and one is lost (the last metadata writer wins: docs/design.md, "Locks"). Here
both nodes' drives cross their thresholds together, round after round; every
extension must be in the final metadata, and each node's device-mapper table
must agree with it.
"""

from __future__ import annotations

import threading

from tests.harness.daemonlog import extensions
from tests.harness.polling import wait_until
from tests.harness.twonode import (
    Cluster,
    MiB,
    Node,
    create_thin_volume,
    device_size,
    file_node,
    fmt_node,
    launch_vm,
    lv_size,
    vm_lv,
)

#: The issue asks for 20 rounds (the full set); each is one extension per node,
#: serialized by the storage lock, and took 26 s on average in a full run
#: (two guests under TCG on 2 cores). ``make check`` runs 6, to fit CI's budget.
QUICK_ROUNDS, FULL_ROUNDS = 6, 20
INITIAL, CHUNK = 64 * MiB, 32 * MiB
ROUND_TIMEOUT = 120.0


def threshold(node: Node, vmid: int) -> int:
    return int(node.vm(vmid, "named_node", file_node(vmid))["write_threshold"])


def test_extensions_from_both_nodes_at_once_are_all_kept(daemons: Cluster, full: bool) -> None:
    cluster = daemons
    rounds = FULL_ROUNDS if full else QUICK_ROUNDS
    vms = {cluster.a: 101, cluster.b: 102}
    paths = {node: create_thin_volume(node, cluster.vg, vmid, size=INITIAL)
             for node, vmid in vms.items()}
    for node, vmid in vms.items():
        launch_vm(node, vmid, paths[node])
    try:
        for node, vmid in vms.items():
            wait_until(lambda n=node, v=vmid: threshold(n, v) == INITIAL - CHUNK // 2, 60,
                       f"{node.name}: threshold armed")
        written = 0
        for k in range(rounds):
            # Past threshold k (INITIAL + k*CHUNK - CHUNK/2) by 4 MiB, short of the next.
            end = INITIAL + k * CHUNK - CHUNK // 2 + 4 * MiB
            errors: list[str] = []

            def write(node: Node, vmid: int, start: int = written, stop: int = end,
                      errors: list[str] = errors) -> None:
                r = node.vm(vmid, "write_pattern", fmt_node(vmid), start, stop - start, vmid % 256,
                            check=False)
                if not r["ok"]:
                    errors.append(f"{node.name}: {r['error']}")

            threads = [threading.Thread(target=write, args=(n, v)) for n, v in vms.items()]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert errors == [], f"round {k}: {errors}"
            written = end
            want = INITIAL + (k + 1) * CHUNK
            for node, vmid in vms.items():
                wait_until(lambda n=node, v=vmid, w=want: threshold(n, v) == w - CHUNK // 2,
                           ROUND_TIMEOUT, f"round {k}: {node.name} extended and re-armed")
        final = INITIAL + rounds * CHUNK
        for node, vmid in vms.items():
            lv = vm_lv(vmid)
            for seen_from in cluster.nodes:  # the one metadata, read from both nodes
                assert lv_size(seen_from, cluster.vg, lv) == final, (node.name, seen_from.name)
            assert device_size(node, cluster.vg, lv) == final
            assert node.vm(vmid, "read_verify", fmt_node(vmid), 0, written, vmid % 256, timeout=300)
            assert len(extensions(node.log_text("pvestord"), VMID=str(vmid))) >= rounds
    finally:
        checks = {}
        for node, vmid in vms.items():
            node.call("vm_shutdown", vmid=vmid)
            node.run(["vgmknodes", cluster.vg], check=False)  # see twonode.lvm
            checks[node.name] = node.run(["qemu-img", "check", paths[node]], check=False)
            node.run(["lvremove", "-q", "-f", paths[node]], check=False)
    for name, check in checks.items():
        assert check.rc == 0, (name, check.stdout + check.stderr)
