"""Node reports and ``rank-nodes``: the pure ranking, the report files, the command."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from pvestord.engine import nodereport
from pvestord.engine.lvmchanges import LvmHealth
from pvestord.engine.nodereport import NodeReport, StorageView
from pvestord.features import ranking

PVESTORD = Path(sys.executable).with_name("pvestord")
NOW = 1_000_000.0
GOOD = StorageView(vg="san", visible=True, pvs=2, free=10 << 30, extent_size=4 << 20)


def report(node: str, *, age: float = 1.0, stopped: bool = False,
           **storages: StorageView) -> NodeReport:
    return NodeReport(node=node, time=NOW - age, interval=10.0,
                      storages=storages or {"san": GOOD}, stopped=stopped)


def rank(storages: list[str], candidates: list[str] | None, *reports: NodeReport,
         problems: dict[str, str] | None = None) -> list[ranking.Ranked]:
    return ranking.rank_nodes(storages, candidates, {r.node: r for r in reports},
                              problems or {}, now=NOW)


# -- the pure ranking

def test_every_reason_a_node_is_left_out() -> None:
    hidden = StorageView(vg="san", visible=False, lvm_ok=False,
                         error="Volume group \"san\" not found")
    failing = StorageView(vg="san", visible=True, lvm_ok=False, error="lvextend timed out")
    missing = StorageView(vg="san", visible=True, pvs=2, missing_pvs=1)
    ranked = {r.node: r for r in rank(
        ["san"], ["ok", "hidden", "failing", "missing", "stale", "stopped", "other", "gone",
                  "broken"],
        report("ok"), report("hidden", san=hidden), report("failing", san=failing),
        report("missing", san=missing), report("stale", age=61), report("stopped", stopped=True),
        report("other", other=GOOD), problems={"broken": "x.json: not JSON"})}
    assert ranked["ok"].eligible and ranked["ok"].reasons == ()
    assert ranked["hidden"].reasons == (
        'storage san: VG san is not visible here (Volume group "san" not found)',)
    assert ranked["failing"].reasons == (
        "storage san: last LVM command on VG san failed (lvextend timed out)",)
    assert ranked["missing"].reasons == ("storage san: VG san is missing 1 of 2 PVs here",)
    assert ranked["stale"].reasons == ("report is stale: 61 s old (limit 60 s)",)
    assert ranked["stopped"].reasons == ("pvestord was stopped on this node",)
    assert ranked["other"].reasons == ("storage san is not configured for this node",)
    assert ranked["gone"].reasons == ("no report from this node's pvestord",)
    assert ranked["broken"].reasons == ("x.json: not JSON",)
    assert [r.node for r in ranked.values() if r.eligible] == ["ok"]


def test_a_guest_on_two_storages_needs_both() -> None:
    both = report("both", san=GOOD, san2=GOOD)
    one = report("one", san=GOOD)
    ranked = rank(["san", "san2"], ["one", "both"], both, one)
    assert [(r.node, r.eligible) for r in ranked] == [("both", True), ("one", False)]
    assert ranked[1].reasons == ("storage san2 is not configured for this node",)


def test_warnings_rank_lower_but_keep_a_node() -> None:
    full = StorageView(vg="san", visible=True, pvs=1, free=0, extent_size=4 << 20)
    ranked = rank(["san"], ["old", "full", "fresh"], report("old", age=45),
                  report("full", san=full), report("fresh"))
    assert [(r.node, r.eligible) for r in ranked] == [("fresh", True), ("old", True),
                                                     ("full", True)]
    assert ranked[1].warnings == ("report is 45 s old",)
    assert ranked[2].warnings == ("storage san: VG san is full (0 B free)",)


def test_without_candidates_every_reporting_node_by_name() -> None:
    ranked = rank(["san"], None, report("b"), report("a", stopped=True),
                  problems={"c": "unreadable", "*": "ignored as a node"})
    assert [r.node for r in ranked] == ["b", "a", "c"]


views = st.builds(StorageView, vg=st.just("san"), visible=st.booleans(),
                  pvs=st.integers(0, 4), missing_pvs=st.integers(0, 4),
                  free=st.integers(0, 1 << 40), extent_size=st.just(4 << 20),
                  lvm_ok=st.booleans(), error=st.none() | st.text(max_size=20))
reports = st.builds(report, node=st.sampled_from("abcdefgh"), age=st.floats(-100, 500),
                    stopped=st.booleans(), san=views)


@given(st.lists(reports, max_size=8), st.none() | st.lists(st.sampled_from("abcdefghij"),
                                                            max_size=10))
def test_ranking_properties(all_reports: list[NodeReport], candidates: list[str] | None) -> None:
    by_node = {r.node: r for r in all_reports}
    ranked = ranking.rank_nodes(["san"], candidates, by_node, {}, now=NOW)
    names = [r.node for r in ranked]
    # every candidate once, none invented
    expected = sorted(by_node) if candidates is None else list(dict.fromkeys(candidates))
    assert sorted(names) == sorted(expected)
    # eligible ones first, and in the caller's order within a class
    flags = [r.eligible for r in ranked]
    assert flags == sorted(flags, reverse=True)
    for cls in (True, False):
        order = [n for n in names if ranked[names.index(n)].eligible is cls]
        assert order == sorted(order, key=lambda n: (bool(ranked[names.index(n)].warnings),
                                                     expected.index(n)))
    for r in ranked:
        # a node is eligible exactly when it has no reason against it
        assert r.eligible == (not r.reasons)
        rep = by_node.get(r.node)
        if r.eligible:
            assert rep is not None and not rep.stopped and NOW - rep.time <= 60
            view = rep.storages["san"]
            assert view.visible and view.lvm_ok and view.missing_pvs == 0


# -- report files

def test_publish_and_read_back(tmp_path: Path) -> None:
    mine = report("node1", san=StorageView(vg="san", visible=False, lvm_ok=False, error="gone"))
    path = nodereport.publish(tmp_path, mine)
    assert path == tmp_path / "node1" / "pvestord.json"
    assert list(path.parent.iterdir()) == [path]  # no temp file left
    reports, problems = nodereport.read_reports(tmp_path)
    assert reports == {"node1": mine} and problems == {}


def test_unreadable_reports_name_their_node_and_the_reason(tmp_path: Path) -> None:
    nodereport.publish(tmp_path, report("good"))
    for node, text in {"garbage": "{not json", "other": json.dumps({"format": 99}),
                       "liar": report("someone-else").to_json(),
                       "typed": json.dumps({"format": 1, "node": "typed", "time": "x",
                                            "interval": 1}),
                       "badview": json.dumps({"format": 1, "node": "badview", "time": 1,
                                              "interval": 1, "storages": {"san": {
                                                  "vg": "san", "visible": "yes",
                                                  "lvm_ok": True}}})}.items():
        (tmp_path / node).mkdir()
        (tmp_path / node / "pvestord.json").write_text(text)
    (tmp_path / "oldnode").mkdir()  # pmxcfs keeps folders of nodes long gone
    (tmp_path / "huge").mkdir()
    (tmp_path / "huge" / "pvestord.json").write_text(" " * (nodereport.MAX_REPORT_BYTES + 1))
    reports, problems = nodereport.read_reports(tmp_path)
    assert list(reports) == ["good"]
    assert sorted(problems) == ["badview", "garbage", "huge", "liar", "other", "typed"]
    assert "not JSON" in problems["garbage"]
    assert "format 1" in problems["other"]
    assert "written for node 'someone-else'" in problems["liar"]
    assert "malformed" in problems["typed"] and "malformed" in problems["badview"]
    assert "larger than" in problems["huge"]


def test_hostile_node_names_cannot_escape_the_folder(tmp_path: Path) -> None:
    for name in ("", "../etc", ".hidden", "a/b"):
        try:
            nodereport.report_path(tmp_path, name)
        except ValueError as err:
            assert "cannot name a folder" in str(err)
        else:
            raise AssertionError(f"{name!r} accepted")


def test_lvm_health_keeps_the_last_outcome_until_taken() -> None:
    health = LvmHealth()
    assert health.take("san") is None
    health.record("san", "lvextend failed")
    health.record("san2", "x")
    health.record("san2", None)  # a later success clears it
    assert health.take("san") == "lvextend failed"
    assert health.take("san") is None
    assert health.take("san2") is None


# -- the command

CFG = "lvm: san\n\tvgname san\n\tshared 1\n\tpvestord-chunksize 1G\n\nlvm: thick\n\tvgname other\n"


def rank_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "storage.cfg").write_text(CFG)
    return subprocess.run(  # noqa: S603 - argument list, the installed entry point
        [str(PVESTORD), "--queue", str(tmp_path / "extend-queue"), "rank-nodes", *args,
         "--storage-config", str(tmp_path / "storage.cfg")],
        capture_output=True, text=True, timeout=30, check=False)


def test_cli_ranks_from_the_nodes_folder_beside_the_queue(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes"
    fresh = NodeReport(node="n1", time=time.time(), interval=10.0, storages={"san": GOOD})
    nodereport.publish(nodes, fresh)
    nodereport.publish(nodes, NodeReport(node="n2", time=time.time(), interval=10.0,
                                         stopped=True))
    done = rank_cli(tmp_path, "101", "--storages", "san", "--candidates", "n2,n1,n3")
    assert done.returncode == 0, done.stderr
    # The ages depend on how long the command took to start: not the point here.
    assert re.sub(r"report \d+ s old", "report N s old", done.stdout).splitlines() == [
        "VM 101 on san:",
        "  n1: eligible (report N s old)",
        "  n2: left out (report N s old)",
        "    pvestord was stopped on this node",
        "  n3: left out (no report)",
        "    no report from this node's pvestord",
    ]
    out = json.loads(rank_cli(tmp_path, "101", "--storages", "san", "--json").stdout)
    assert [(n["node"], n["eligible"]) for n in out["nodes"]] == [("n1", True), ("n2", False)]
    # none eligible: exit status 3, for a hook to tell "no node" from "error"
    assert rank_cli(tmp_path, "101", "--storages", "san", "--candidates", "n2").returncode == 3


def test_cli_refuses_what_is_not_a_thin_storage(tmp_path: Path) -> None:
    done = rank_cli(tmp_path, "101", "--storages", "thick,nosuch")
    assert done.returncode == 1
    assert "not a thin storage" in done.stderr and "thick, nosuch" in done.stderr
    bad = rank_cli(tmp_path, "0", "--storages", "san")
    assert bad.returncode == 1 and "VMID" in bad.stderr.upper()


@given(free=st.integers(min_value=0, max_value=2**50), other_free=st.integers(0, 2**50),
       interval=st.floats(min_value=0.5, max_value=600),
       age=st.floats(min_value=-1000, max_value=10_000), stopped=st.booleans())
def test_a_report_is_written_when_it_changed_or_its_heartbeat_is_due(
        free: int, other_free: int, interval: float, age: float, stopped: bool) -> None:
    """An idle node writes to /etc/pve at most 3 times a minute
    for its report; what changed is written at once."""
    def report(when: float, vg_free: int, stop: bool = False) -> NodeReport:
        view = StorageView(vg="vg1", visible=True, free=vg_free)
        return NodeReport("n1", when, interval, {"san": view}, stopped=stop)
    previous = report(1000.0, free)
    assert nodereport.publish_due(None, previous)
    same = report(1000.0 + age, free)
    heartbeat = nodereport.HEARTBEAT_INTERVALS * interval
    seen = same.time - previous.time  # the age as floats make it
    assert nodereport.publish_due(previous, same) == (not 0 <= seen < heartbeat)
    changed = report(1000.0 + age, other_free, stopped)
    if other_free != free or stopped:
        assert nodereport.publish_due(previous, changed)
