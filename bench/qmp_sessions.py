"""Scenario 8: how long pvestord holds a VM's QMP socket.

QEMU serves one QMP client at a time on ``<vmid>.qmp``, and qemu-server
gives each of its calls 5 s, connect included: every moment pvestord holds
the socket, ``qm`` commands, pvestatd and a migration's own calls wait. A
pass therefore observes, leaves the socket, asks LVM, and comes back to arm
(pvestord/engine/extender.py).

A proxy on the VM's socket path (tests/harness/qmpproxy.py) times each of
pvestord's sessions, from QEMU's greeting (QEMU serves it now) to the close,
over ``extensions`` extensions of one drive under the daemons (a threshold
crossed, ``lvextend``, the re-arm), with the reconciles between them. The
figure is the longest session; its target is 200 ms in the node guest.

Beside it, a stand-in for qemu-server (:class:`QemuServerStandIn`, a call
every 100 ms on QEMU's own socket, as ``PVE::QMPClient`` makes them) gives
what that costs qemu-server: how long its calls waited for the monitor,
with a target of 1 s, a fifth of its 5 s budget. The node tier's
test_qmp_manners asserts the rule behind both (no LVM command of a VM while
pvestord holds its socket) by order; the times are measured here only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import latency
from bench.report import Figure, summary
from tests.harness.qmpproxy import CountingQmpProxy, QemuServerStandIn

#: The longest session's target in the node guest, seconds.
LONGEST_TARGET = 0.2
#: qemu-server's budget is 5 s; a call that waits a fifth of it was held up.
QEMU_SERVER_WAIT_TARGET = 1.0


def run(out: Path, extensions: int) -> dict[str, Any]:
    """Every pvestord session on one VM's socket over ``extensions`` extensions."""
    with latency.daemon_side(out, "qmp_sessions", extensions) as side:
        proxy = CountingQmpProxy(side.vm.qmp_path)
        try:
            with QemuServerStandIn(proxy.upstream) as qemu_server:
                for _ in range(extensions):
                    side.sample()
        finally:
            proxy.close()
    return {"extensions": extensions, "sessions": summary(proxy.sessions),
            "sessions_per_extension": len(proxy.sessions) / extensions,
            "qemu_server_waits": summary(qemu_server.waits),
            "qemu_server_failures": len(qemu_server.failures)}


def figures(result: dict[str, Any] | None) -> list[Figure]:
    sessions = result["sessions"] if result else {}
    waits = result.get("qemu_server_waits", {}) if result else {}
    return [
        Figure("8 QMP", "longest pvestord QMP session", sessions.get("max"), "s",
               target=("<", LONGEST_TARGET),
               note="" if result is None else f"{sessions['n']} sessions over "
               f"{result['extensions']} extensions"),
        Figure("8 QMP", "pvestord QMP session p50", sessions.get("p50"), "s"),
        Figure("8 QMP", "QMP sessions per extension",
               None if result is None else result["sessions_per_extension"]),
        Figure("8 QMP", "longest wait of a qemu-server call for the monitor",
               waits.get("max"), "s", target=("<", QEMU_SERVER_WAIT_TARGET),
               note="" if not waits or result is None else
               f"{waits['n']} calls, {result['qemu_server_failures']} past its 5 s")]
