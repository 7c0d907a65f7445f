"""The benchmark's report builder on synthetic numbers, its set-up on fakes: no guest, LVM, QEMU.

Imports bench.run so that a broken bench module fails ``make check`` without
booting a node guest.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest

from bench import blockjobs, drives, run, together
from bench.fleet import idle_counts
from bench.latency import Sample, split_summary
from bench.lvm_shell import LvmShellError
from bench.report import Figure, build_report, percentile, ratio, summary, table
from tests.harness.lvmbed import VG

MiB = 1024 * 1024


def test_percentile_interpolates_between_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0]  # unsorted on purpose
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(list(map(float, range(1, 101))), 99) == pytest.approx(99.01)


def test_percentile_of_one_value_is_that_value() -> None:
    assert percentile([0.7], 99) == 0.7


@pytest.mark.parametrize("values, p", [([], 50), ([1.0], -1), ([1.0], 101)])
def test_percentile_refuses_nonsense(values: list[float], p: float) -> None:
    with pytest.raises(ValueError):
        percentile(values, p)


def test_summary_of_no_values_has_only_the_count() -> None:
    assert summary([]) == {"n": 0}
    assert summary([2.0, 1.0])["p50"] == pytest.approx(1.5)


def test_ratio_is_unknown_without_both_sides() -> None:
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(None, 2.0) is None
    assert ratio(1.0, None) is None
    assert ratio(1.0, 0.0) is None


@pytest.mark.parametrize("value, target, status", [
    (1.0, ("<=", 1.15), "met"), (1.2, ("<=", 1.15), "missed"), (1.5, (">=", 1.5), "met"),
    (0.5, ("<", 0.5), "missed"), (None, ("<", 0.5), "not measured"), (3.0, None, "-")])
def test_figure_status_follows_its_target(value: float | None, target: tuple[str, float] | None,
                                          status: str) -> None:
    assert Figure("s", "f", value, target=target).status == status


def test_sample_split_adds_up_to_the_total() -> None:
    sample = Sample(event=100.0, round_started=100.2, extended=101.0, armed=101.1,
                    qmp_in_round=0.05, lock_wait=0.01, lvm=0.6)
    split = sample.split()
    assert split["total"] == pytest.approx(1.1)
    assert split["queue_wait"] == pytest.approx(0.2)
    assert split["qmp"] == pytest.approx(0.15)  # round's QMP + the re-arm session
    assert split["total_without_lvm"] == pytest.approx(0.5)
    parts = sum(v for k, v in split.items() if k not in ("total", "total_without_lvm"))
    assert parts == pytest.approx(split["total"])


def synthetic_results() -> dict[str, object]:
    def latency(totals: list[float]) -> dict[str, object]:
        return {"summary": split_summary([
            {"total": t, "queue_wait": 0.1, "qmp": 0.1, "lock_wait": 0.0, "lvm": t - 0.3,
             "other": 0.1, "total_without_lvm": 0.3} for t in totals])}

    return {
        "latency": latency([1.0, 1.2, 1.1]),
        "floor": {"summary": {"total": summary([1.0, 0.9, 1.0])}},
        "naive_floor": {"summary": {"total": summary([2.0, 1.9, 2.1])}},
        "original": latency([2.0, 1.5, 1.6]),
        "lvm_shell": {"summary": {k: summary(v) for k, v in {
            "plain_lvextend": [0.8, 0.8], "shell_lvextend": [0.4, 0.4],
            "plain_lvs_lvextend": [1.2], "shell_lvs_lvextend": [0.6]}.items()}},
        "pause_free": {"rate": 100 * MiB, "smallest_clean_headroom": 600 * MiB,
                       "settings": []},
        "fleet": {"burst_one_vg": {"seconds": 20.0}, "burst_two_vgs": {"seconds": 13.0},
                  "idle": {"pvestord": {"cpu_percent": 0.2, "cpu_percent_with_children": 0.9,
                                        "rss_bytes": 40 * 1024 * 1024},
                           "qmeventd-py": {"cpu_percent": 0.1,
                                           "cpu_percent_with_children": 0.1,
                                           "rss_bytes": 70 * 1024 * 1024}}},
    }


def by_name(figures: list[Figure]) -> dict[str, Figure]:
    return {f.name: f for f in figures}


def test_figures_compute_the_issue_ratios_and_judge_them() -> None:
    figures = by_name(run.figures_for(synthetic_results()))
    assert figures["daemon/floor p50"].value == pytest.approx(1.1 / 1.0)
    assert figures["daemon/floor p50"].status == "met"
    assert figures["original/ours p50"].value == pytest.approx(1.6 / 1.1)
    assert figures["original/ours p50"].status == "missed"
    assert figures["ours/naive-floor p50"].value == pytest.approx(1.1 / 2.0)
    assert figures["ours/naive-floor p50"].status == "met"
    assert figures["shell/plain lvextend p50"].value == pytest.approx(0.5)
    assert figures["shell/plain lvextend p50"].status == "-"
    assert figures["two-VG/one-VG"].value == pytest.approx(0.65)
    assert figures["two-VG/one-VG"].status == "missed"
    assert figures["pvestord CPU % with its LVM children"].status == "missed"
    assert figures["qmeventd-py RSS"].value == pytest.approx(70)
    assert figures["qmeventd-py RSS"].status == "missed"
    # p99 of the latency samples is ~1.198 s: 600 MiB / (100 MiB/s x 1.198 s) > 1.5.
    assert figures["rate x p99 latency"].value == pytest.approx(100 * 1.198, rel=1e-3)
    assert figures["zero-failure headroom / (rate x p99)"].status == "missed"


def test_no_clean_pause_free_setting_is_a_miss_not_a_gap() -> None:
    results = synthetic_results()
    results["pause_free"] = {"rate": 100 * MiB, "smallest_clean_headroom": None, "settings": [
        {"headroom": 230 * MiB, "failed_writes": 3}]}
    figure = by_name(run.figures_for(results))["zero-failure headroom / (rate x p99)"]
    assert figure.value is None
    assert figure.status == "missed"
    assert "230 MiB: 3 failed" in figure.note


def test_a_missing_scenario_is_not_measured_never_met() -> None:
    results = synthetic_results()
    del results["floor"], results["fleet"], results["pause_free"]
    figures = by_name(run.figures_for(results))
    assert figures["zero-failure headroom / (rate x p99)"].status == "not measured"
    assert figures["daemon/floor p50"].status == "not measured"
    assert figures["two-VG/one-VG"].status == "not measured"
    assert figures["original/ours p50"].value is not None


def test_report_is_json_with_counts_and_what_was_not_done() -> None:
    figures = run.figures_for(synthetic_results())
    report = build_report(quick=True, scenarios=synthetic_results(), figures=figures,
                          not_done={"pause_free": "not built"}, environment={"cpus": 2})
    decoded = json.loads(json.dumps(report))
    assert decoded["not_done"] == {"pause_free": "not built"}
    statuses = [f["status"] for f in decoded["figures"]]
    assert decoded["targets"] == {"met": statuses.count("met"),
                                  "missed": statuses.count("missed")}
    assert decoded["targets"]["missed"] > 0


def test_table_has_a_row_per_figure_with_its_status() -> None:
    figures = [Figure("2 floor", "daemon/floor p50", 1.3, target=("<=", 1.15)),
               Figure("1 latency", "p50", None, "s", note="guest crashed")]
    lines = table(figures).splitlines()
    assert lines[0].split() == ["SCENARIO", "FIGURE", "VALUE", "TARGET", "STATUS"]
    assert lines[1].endswith("missed") and "<= 1.15" in lines[1]
    assert lines[2].endswith("not measured")
    assert "guest crashed" in lines[-1]


def test_ratios_of_sides_sampled_in_turn_say_so_in_their_note() -> None:
    results = synthetic_results()
    assert by_name(run.figures_for(results))["daemon/floor p50"].note == ""
    for name in ("latency", "floor", "naive_floor", "original"):
        results[name] = {**results[name], "interleaved": "in turn"}  # type: ignore[dict-item]
    figures = by_name(run.figures_for(results))
    assert "in turn" in figures["daemon/floor p50"].note
    assert "in turn" in figures["ours/naive-floor p50"].note
    assert "in turn" in figures["original/ours p50"].note
    assert "daemon/floor p50: both sides sampled in turn" in table(list(figures.values()))


class FakeBed:
    """A context manager that records its entry and exit, and can fail on entry."""

    def __init__(self, name: str, log: list[str], fail: bool = False) -> None:
        self.name = name
        self.log = log
        self.fail = fail

    def __enter__(self) -> str:
        if self.fail:
            raise RuntimeError(f"{self.name} failed")
        self.log.append(f"enter {self.name}")
        return self.name

    def __exit__(self, *exc: object) -> None:
        self.log.append(f"exit {self.name}")


def test_beds_entered_together_all_exit_with_the_stack() -> None:
    log: list[str] = []
    with contextlib.ExitStack() as stack:
        names = together.enter_together(stack, [FakeBed("a", log), FakeBed("b", log)])
        assert names == ["a", "b"]
        assert sorted(log) == ["enter a", "enter b"]
    assert sorted(log) == ["enter a", "enter b", "exit a", "exit b"]


def test_a_bed_that_fails_to_start_leaves_none_of_the_others_running() -> None:
    log: list[str] = []
    with pytest.raises(RuntimeError, match="b failed"), contextlib.ExitStack() as stack:
        together.enter_together(stack, [FakeBed("a", log), FakeBed("b", log, fail=True),
                                        FakeBed("c", log)], parallel=1)
    assert sorted(log) == ["enter a", "enter c", "exit a", "exit c"]


def test_a_failed_scenario_marks_every_result_it_would_have_produced(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def fake_side_by_side() -> dict[str, dict[str, object]]:
        raise RuntimeError("guest too slow")

    def fake_shell() -> dict[str, dict[str, object]]:
        return {"lvm_shell": synthetic_results()["lvm_shell"]}  # type: ignore[dict-item]

    monkeypatch.setattr(run, "scenarios", lambda out, sizes: [
        ("latency", fake_side_by_side), ("lvm_shell", fake_shell)])
    assert run.main(["--out", str(tmp_path), "--quick", "--only", "floor",
                     "--only", "lvm_shell"]) == 1
    report = json.loads((tmp_path / "bench.json").read_text())
    assert set(report["not_done"]) == {"latency", "floor", "naive_floor", "original"}
    assert "guest too slow" in report["not_done"]["floor"]
    assert report["scenarios"]["lvm_shell"]["seconds"] >= 0
    statuses = {f["name"]: f["status"] for f in report["figures"]}
    assert statuses["shell/plain lvextend p50"] == "-"
    assert statuses["ours/naive-floor p50"] == "not measured"
    assert statuses["daemon/floor p50"] == "not measured"


class FakeLvmShell:
    """Stands in for bench.lvm_shell.LvmShell: only records that it was closed."""

    closed: list[FakeLvmShell] = []

    def close(self) -> None:
        FakeLvmShell.closed.append(self)


class FakeVG(VG):
    """A VG whose plain ``lvcreate`` only records the LV."""

    def __init__(self, name: str, plain: list[str]) -> None:
        super().__init__(name)
        self.plain = plain

    def create_lv(self, lv: str, size: int) -> str:
        self.plain.append(lv)
        return f"plain:{self.lv_path(lv)}"


@pytest.fixture()
def fake_lvm(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Shell lvcreates that fail for LVs named in ``failing``; what ran, by kind."""
    ran: dict[str, list[str]] = {"shell": [], "commands": [], "formatted": [], "failing": []}

    def fake_shell_lvcreate(shell: object, vg: VG, lv: str, size: int) -> str:
        ran["shell"].append(lv)
        if lv in ran["failing"]:
            raise LvmShellError(f"{lv}: no device")
        return f"shell:{vg.lv_path(lv)}"

    FakeLvmShell.closed.clear()
    monkeypatch.setattr(drives, "LvmShell", FakeLvmShell)
    monkeypatch.setattr(drives, "shell_lvcreate", fake_shell_lvcreate)
    monkeypatch.setattr(drives, "sh", lambda *argv, **_: ran["commands"].append(" ".join(argv)))
    monkeypatch.setattr(drives, "qcow2_create",
                        lambda path, virtual: ran["formatted"].append(f"{path} {virtual}"))
    return ran


def test_drives_are_made_in_their_own_vg_and_each_formatted(
        fake_lvm: dict[str, list[str]]) -> None:
    plain: list[str] = []
    vg_a, vg_b = FakeVG("a", plain), FakeVG("b", plain)
    paths = drives.create_drives([(vg_a, 1), (vg_b, 2), (vg_a, 3)], 32, 1000)
    assert paths == {1: "shell:/dev/a/vm-1-disk-0.qcow2", 2: "shell:/dev/b/vm-2-disk-0.qcow2",
                     3: "shell:/dev/a/vm-3-disk-0.qcow2"}
    assert sorted(fake_lvm["formatted"]) == sorted(f"{p} 1000" for p in paths.values())
    assert plain == []
    assert len(FakeLvmShell.closed) == 2  # one shell per VG


def test_a_failing_lvm_shell_leaves_the_rest_of_its_vg_to_one_lvcreate_each(
        fake_lvm: dict[str, list[str]]) -> None:
    fake_lvm["failing"].append("vm-2-disk-0.qcow2")
    plain: list[str] = []
    made: list[tuple[int, str]] = []
    drives.create_in_vg(FakeVG("a", plain), [1, 2, 3], 32, lambda *drive: made.append(drive))
    assert made == [(1, "shell:/dev/a/vm-1-disk-0.qcow2"), (2, "plain:/dev/a/vm-2-disk-0.qcow2"),
                    (3, "plain:/dev/a/vm-3-disk-0.qcow2")]
    assert fake_lvm["shell"] == ["vm-1-disk-0.qcow2", "vm-2-disk-0.qcow2"]
    # Whatever the failed command left is removed before lvcreate makes it anew.
    assert fake_lvm["commands"] == ["lvremove -q -f a/vm-2-disk-0.qcow2"]
    assert len(FakeLvmShell.closed) == 1


def test_placement_is_a_scenario_of_make_bench(tmp_path: Path) -> None:
    """``make bench`` runs ``bench.placement`` with the others: one real run."""
    assert "placement" in [name for name, _ in run.scenarios(tmp_path, run.QUICK)]
    assert run.main(["--out", str(tmp_path), "--quick", "--only", "placement"]) == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["not_done"] == {}
    cases = report["scenarios"]["placement"]["cases"]
    assert set(cases) == {"basic maintenance", "basic fail", "static maintenance",
                          "static fail"}
    assert all(case["decisions"] > 0 and case["median"] > 0 for case in cases.values())
    rows = {f["name"]: f for f in report["figures"] if f["scenario"] == "placement"}
    assert rows["basic maintenance"]["value"] == cases["basic maintenance"]["median"]
    # Judged against the 1 s target on the host; in the emulated node guest, not judged.
    in_guest = os.environ.get("PVESTORD_IN_NODE_GUEST") == "1"
    assert rows["basic maintenance"]["target"] == (None if in_guest else "<= 1")


def test_placement_rows_without_a_run_are_not_measured_and_in_the_guest_untargeted() -> None:
    absent = by_name(run.figures_for({}))
    assert absent["static fail"].status == "not measured"
    case = {"median": 3.5, "cpu_median": 3.0, "decisions": 64}
    guest = {"runs": 1, "in_node_guest": True,
             "cases": {name: case for name in ("basic maintenance", "basic fail",
                                                "static maintenance", "static fail")}}
    rows = by_name(run.figures_for({"placement": guest}))
    assert rows["static fail"].status == "-"
    assert "emulated node guest" in rows["static fail"].note
    host = {**guest, "in_node_guest": False}
    assert by_name(run.figures_for({"placement": host}))["static fail"].status == "missed"


def test_idle_counts_are_rates_between_two_published_views() -> None:
    before = {"time": 1000.0, "tally": {"commands": {"lvm": 3},
                                        "events": {"qmp_session": 100, "cluster_write": 10}}}
    after = {"time": 1120.0, "tally": {
        "commands": {"lvm": 3, "qemu-img": 2},
        "events": {"qmp_session": 180, "cluster_write": 22, "cluster_lock_attempt": 0}}}
    assert idle_counts(before, after, qemus=20) == {
        "minutes": 2.0, "lvm_processes_per_minute": 0.0, "processes_per_minute": 1.0,
        "qmp_sessions_per_vm_per_minute": 2.0, "pmxcfs_writes_per_minute": 6.0}


def test_qmp_session_rows_judge_the_longest_session() -> None:
    """Scenario 8 (QMP sessions): the longest session against 200 ms; absent, not measured."""
    assert "qmp_sessions" in [name for name, _ in run.scenarios(Path("/tmp"), run.QUICK)]
    assert by_name(run.figures_for({}))["longest pvestord QMP session"].status == \
        "not measured"
    result = {"extensions": 2, "sessions": summary([0.02, 0.05, 0.04, 0.03, 0.25, 0.02]),
              "sessions_per_extension": 3.0}
    rows = by_name(run.figures_for({"qmp_sessions": result}))
    longest = rows["longest pvestord QMP session"]
    assert (longest.value, longest.status) == (0.25, "missed")
    assert longest.note == "6 sessions over 2 extensions"
    assert rows["QMP sessions per extension"].value == 3.0
    result["sessions"] = summary([0.02, 0.05])
    assert by_name(run.figures_for({"qmp_sessions": result}))[
        "longest pvestord QMP session"].status == "met"


def test_qemu_servers_wait_is_judged_against_a_fifth_of_its_budget() -> None:
    """Scenario 8's stand-in for qemu-server: its longest wait against 1 s;
    a report from before the stand-in existed shows it as not measured."""
    wait = "longest wait of a qemu-server call for the monitor"
    result: dict[str, object] = {"extensions": 2, "sessions": summary([0.02]),
                                 "sessions_per_extension": 1.0}
    assert by_name(run.figures_for({"qmp_sessions": result}))[wait].status == "not measured"
    result |= {"qemu_server_waits": summary([0.01, 1.1, 0.2]), "qemu_server_failures": 0}
    row = by_name(run.figures_for({"qmp_sessions": result}))[wait]
    assert (row.value, row.status, row.note) == (1.1, "missed", "3 calls, 0 past its 5 s")
    result["qemu_server_waits"] = summary([0.01, 0.4])
    assert by_name(run.figures_for({"qmp_sessions": result}))[wait].status == "met"


def test_block_job_figures_are_thick_time_over_pvestords_and_count_failures() -> None:
    def side(p50: float, failed: int, lv_after: int) -> dict[str, object]:
        return {"job_seconds": summary([p50]), "prepare_seconds": summary([0.5]),
                "reduce_seconds": summary([1.5]), "lv_after_bytes": lv_after,
                "failed": failed}

    result = {"rounds": 2, "data_bytes": 256 * MiB, "interleaved": True,
              "commit": {"pvestord": side(2.0, 0, 352 * MiB), "thick": side(1.9, 0, 4100 * MiB)},
              "mirror": {"pvestord": side(2.0, 1, 352 * MiB), "thick": side(1.6, 0, 4100 * MiB)},
              "convert": {"pvestord": side(2.0, 0, 320 * MiB),
                          "thick": side(1.92, 0, 4100 * MiB)}}
    figures = by_name(blockjobs.figures(result))
    assert figures["commit speed pvestord/thick"].value == pytest.approx(0.95)
    assert figures["commit speed pvestord/thick"].status == "met"  # 0.9 for a commit
    assert figures["mirror speed pvestord/thick"].value == pytest.approx(0.8)
    assert figures["mirror speed pvestord/thick"].status == "missed"
    assert figures["convert speed pvestord/thick"].value == pytest.approx(0.96)
    assert figures["convert speed pvestord/thick"].status == "met"  # 0.95 for a copy
    assert figures["commit failed"].status == "met"
    assert figures["mirror failed"].status == "missed"
    assert figures["commit plugin preparation p50"].value == pytest.approx(0.5)
    assert figures["convert reduction p50"].value == pytest.approx(1.5)
    assert "commit reduction p50" not in figures
    assert figures["convert LV after, pvestord"].value == pytest.approx(320)
    assert figures["mirror LV after, thick"].value == pytest.approx(4100)
    assert {f.status for f in blockjobs.figures(None) if f.target} == {"not measured"}
