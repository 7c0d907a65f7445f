"""``pvestord rank-nodes`` on the two-node bed: real reports from both nodes' daemons.

Each node's pvestord probes its VGs every 10 s (the default), every 2 s once
the test restarts B's, and publishes ``<pve>/nodes/<node>/pvestord.json``
when the view changes and at least every two intervals. B is made to lose
sight of the SAN by an LVM device filter that rejects every device
(``LVM_SYSTEM_DIR`` pointing at an lvm.conf of its own, for B's pvestord
only: the guest's root is the host's, read-only as far as we are
concerned), then its pvestord is killed (a stale report) and, in the full
set, stopped cleanly (a report marked stopped). B's daemons run again at the
end. Every restart of pvestord costs tens of seconds of Python start-up
under emulation: the steps are ordered to need as few as possible.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness.daemonlog import records
from tests.harness.polling import wait_until
from tests.harness.twonode import Cluster, Node, create_thin_volume, vm_lv

VMID = 381
#: Rejects every device: the VG, its PVs and LVs vanish from this LVM's view.
HIDE_EVERYTHING = 'devices {\n\tglobal_filter = [ "r|.*|" ]\n}\n'


def rank(cluster: Cluster, node: Node, *args: str) -> tuple[int, dict[str, Any]]:
    r = node.run([str(cluster.bin / "pvestord"), "--queue", str(cluster.pve / "extend-queue"),
                  "rank-nodes", str(VMID), "--storage-config", str(cluster.pve / "storage.cfg"),
                  "--json", *args], check=False)
    assert r.rc in (0, 3), r.stderr
    return r.rc, json.loads(r.stdout)


def verdicts(out: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["node"]: n for n in out["nodes"]}


def wait_verdict(cluster: Cluster, node: str, predicate: Any, what: str,
                 *args: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def check() -> bool:
        nonlocal seen
        _, out = rank(cluster, cluster.a, *args)
        seen = verdicts(out).get(node, {})
        return bool(seen) and bool(predicate(seen))

    try:
        wait_until(check, 60, what, interval=1.0)
    except TimeoutError as err:
        raise AssertionError(f"{err}; last verdict for {node}: {seen}") from None
    return seen


@pytest.fixture
def volume(daemons: Cluster) -> Iterator[Cluster]:
    create_thin_volume(daemons.a, daemons.vg, VMID)
    yield daemons
    daemons.a.run(["lvremove", "-q", "-f", f"{daemons.vg}/{vm_lv(VMID)}"],
                  check=False)


def test_rank_nodes_leaves_out_a_node_without_the_vg_a_stale_and_a_stopped_one(
        volume: Cluster, full: bool) -> None:
    cluster, b = volume, volume.b
    # Both nodes see the VG: both eligible, in the caller's order.
    wait_verdict(cluster, "nodeb", lambda v: v["eligible"], "B eligible")
    rc, out = rank(cluster, cluster.a, "--candidates", "nodeb,nodea,nodec")
    assert rc == 0 and out["storages"] == ["san"]
    assert [(n["node"], n["eligible"]) for n in out["nodes"]] == [
        ("nodeb", True), ("nodea", True), ("nodec", False)]
    assert verdicts(out)["nodec"]["reasons"] == ["no report from this node's pvestord"]

    # B loses sight of the SAN.
    hidden = b.dir / "lvm-hidden"
    hidden.mkdir(exist_ok=True)
    (hidden / "lvm.conf").write_text(HIDE_EVERYTHING)
    b.call("stop", name="pvestord")
    b.start_pvestord(cluster, log="pvestord-hidden", env={"LVM_SYSTEM_DIR": str(hidden)},
                     report_interval=2.0)
    left_out = wait_verdict(cluster, "nodeb", lambda v: not v["eligible"], "B left out")
    assert any("san" in r and "not visible here" in r for r in left_out["reasons"]), left_out
    rc, out = rank(cluster, cluster.a, "--candidates", "nodeb,nodea")
    assert rc == 0 and [n["node"] for n in out["nodes"]] == ["nodea", "nodeb"]
    # ...and B's journal says so.
    assert records(b.log_text("pvestord-hidden"), level="WARNING", VG=cluster.vg)

    # B's pvestord dies: its last report stays, and goes stale.
    b.call("stop", name="pvestord", kill=True)
    wait_until(lambda: not verdicts(rank(cluster, cluster.a, "--stale-after", "5")[1])
               ["nodeb"]["eligible"], 60, "B's report stale")
    stale = verdicts(rank(cluster, cluster.a, "--stale-after", "5")[1])["nodeb"]
    assert not stale["eligible"] and stale["reasons"][0].startswith("report is stale"), stale

    rc, out = rank(cluster, cluster.a, "--candidates", "nodeb", "--stale-after", "5")
    assert rc == 3  # no candidate left: the hook says so by its exit status

    if full:  # two more restarts: the full set only (tests/unit covers the report)
        # A clean stop says so at once.
        b.start_pvestord(cluster, log="pvestord-stopping", report_interval=2.0)
        wait_verdict(cluster, "nodeb", lambda v: v["eligible"], "B eligible after restart")
        b.call("stop", name="pvestord")
        stopped = verdicts(rank(cluster, cluster.a)[1])["nodeb"]
        assert stopped["reasons"] == ["pvestord was stopped on this node"], stopped

    b.start_pvestord(cluster, log="pvestord-final")
    wait_verdict(cluster, "nodeb", lambda v: v["eligible"], "B eligible at the end")
