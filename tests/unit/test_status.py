"""The daemon's published view, its metrics and ``pvestord status`` (engine/status.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pvestord.adapters import tally
from pvestord.adapters.atomicfile import write_atomically
from pvestord.adapters.command import run
from pvestord.adapters.config import parse_storage_config
from pvestord.cli import main
from pvestord.engine import metrics, status
from pvestord.engine.publisher import DaemonView, Publisher
from pvestord.policy import capacity
from pvestord.policy.capacity import LvUsage, Sample
from pvestord.policy.extension import ExtensionState
from pvestord.policy.sizes import GiB


def busy_activity() -> status.Activity:
    activity = status.Activity()
    for vmid, node in ((100, "f0"), (101, "f1"), (102, "f2"), (103, "f3"), (104, "f4")):
        activity.seen(vmid, node, f"vm-{vmid}-disk-0", "vg0", ExtensionState.ARMED,
                      paused_nospace=vmid == 104, maximum=11 * GiB)
    activity.extended(status.Extension(1000.0, 100, "f0", "vg0", "vm-100-disk-0", GiB,
                                       2 * GiB, 180, 20, 90, 240))
    activity.extended(status.Extension(1001.0, 101, "f1", "vg0", "vm-101-disk-0", GiB,
                                       2 * GiB, 700, 300, 350, 3000))
    activity.failure()
    activity.hold(103, "f3", "inside the VG's reserve")
    return activity


def busy_view(activity: status.Activity) -> dict[str, object]:
    with activity.extending(100, "f0"):
        drives = status.drive_rows(activity, errors={(101, "f1"): "lvextend failed"},
                                   deferred={102})
    samples = [Sample(0, 50 * GiB), Sample(1800, 60 * GiB)]
    account = capacity.account("vg0", 100 * GiB, 40 * GiB,
                               [LvUsage(2 * GiB, 11 * GiB), LvUsage(GiB)], samples, 1800)
    return status.snapshot(
        node="n1", pid=os.getpid(), now=2000.0, activity=activity, drives=drives,
        queue_length=3, paused_vms=1,
        accounts={"vg0": status.account_view(account, capacity.Level.OK)},
        lvm_shell_restarts=2)


def test_each_drive_shows_what_the_daemon_does_with_it() -> None:
    view = busy_view(busy_activity())
    states = {d["vmid"]: (d["state"], d["reason"]) for d in view["drives"]}  # type: ignore[attr-defined]
    assert states == {100: ("extending", None), 101: ("failed", "lvextend failed"),
                      102: ("deferred", "the VM is migrating"),
                      103: ("held-by-reserve", "inside the VG's reserve"),
                      104: ("paused-on-enospc", None)}


def test_metrics_parse_with_prometheus_own_parser() -> None:
    text = metrics.render(busy_view(busy_activity()))
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in families.values() for s in f.samples}
    assert families["pvestord_extension_latency_seconds"].type == "histogram"
    assert samples[("pvestord_extensions_total", ())] == 2
    assert samples[("pvestord_extension_failures_total", ())] == 1
    assert samples[("pvestord_extension_latency_seconds_bucket", (("le", "0.25"),))] == 1
    assert samples[("pvestord_extension_latency_seconds_bucket", (("le", "5"),))] == 2
    assert samples[("pvestord_extension_latency_seconds_bucket", (("le", "+Inf"),))] == 2
    assert samples[("pvestord_extension_latency_seconds_sum", ())] == pytest.approx(3.24)
    assert samples[("pvestord_lock_wait_seconds_total", ())] == pytest.approx(0.32)
    assert samples[("pvestord_paused_vms", ())] == 1
    assert samples[("pvestord_queue_length", ())] == 3
    assert samples[("pvestord_lvm_shell_restarts_total", ())] == 2
    assert samples[("pvestord_vg_free_bytes", (("vg", "vg0"),))] == 40 * GiB
    assert samples[("pvestord_vg_time_to_full_seconds", (("vg", "vg0"),))] == 40 * 180
    # 60 GiB used: 57 of it thick, 2 GiB thin LV with an 11 GiB maximum, 1 GiB unmeasured.
    assert samples[("pvestord_vg_overcommit_ratio", (("vg", "vg0"),))] == pytest.approx(0.69)
    # That 1 GiB LV has no recorded maximum: the figures are a floor, said so.
    assert samples[("pvestord_vg_thin_unrecorded_lvs", (("vg", "vg0"),))] == 1


def test_status_reads_the_live_view_and_says_when_the_daemon_is_gone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "status.json"
    assert main(["status", "--file", str(path)]) == 1
    assert "does not run" in capsys.readouterr().err
    view = busy_view(busy_activity())
    view["time"] = __import__("time").time()
    status.publish(path, view)
    assert main(["status", "--json", "--file", str(path)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["live"] is True and shown["queue_length"] == 3
    assert main(["status", "--file", str(path)]) == 0
    shown_text = capsys.readouterr().out
    assert "VG vg0 [ok]" in shown_text
    assert "partial: 1 LV(s) with no recorded maximum" in shown_text
    # A pid that no longer runs: the view is shown, and said to be old.
    view["pid"] = 2 ** 22 + 12345
    status.publish(path, view)
    assert main(["status", "--json", "--file", str(path)]) == 1
    assert json.loads(capsys.readouterr().out)["live"] is False


def test_publisher_writes_status_and_metrics_atomically(tmp_path: Path) -> None:
    config = parse_storage_config("pvestord: t0\n\tvgname vg0\n", "storage.cfg")
    (tmp_path / "prom").mkdir()
    pub = Publisher("n1", busy_activity(), lambda: config, status_file=tmp_path / "s.json",
                    metrics_file=tmp_path / "prom" / "pvestord.prom")
    pub.publish(DaemonView(0, {}, set(), 0))
    assert json.loads((tmp_path / "s.json").read_text())["pid"] == os.getpid()
    families = list(text_string_to_metric_families(
        (tmp_path / "prom" / "pvestord.prom").read_text()))
    assert families
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["prom", "pvestord.prom", "s.json"]


def test_metrics_are_not_written_through_a_link_planted_in_the_exporters_folder(
        tmp_path: Path) -> None:
    # The textfile folder may be writable by node_exporter's user: a link
    # there must not let that user choose a file root truncates and writes.
    config = parse_storage_config("pvestord: t0\n\tvgname vg0\n", "storage.cfg")
    folder = tmp_path / "prom"
    folder.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    metrics_file = folder / "pvestord.prom"
    (folder / f".{metrics_file.name}.{os.getpid()}").symlink_to(victim)
    before = tally.snapshot()
    pub = Publisher("n1", busy_activity(), lambda: config, status_file=tmp_path / "s.json",
                    metrics_file=metrics_file)
    pub.publish(DaemonView(0, {}, set(), 0))
    assert victim.read_text() == "precious\n"
    assert not metrics_file.is_symlink()
    assert oct(metrics_file.stat().st_mode & 0o777) == oct(0o644)  # node_exporter reads it
    text = metrics_file.read_text()
    assert {f.name for f in text_string_to_metric_families(text)} >= {
        "pvestord_cluster_writes", "pvestord_extensions"}
    # Neither file is a write to the cluster file system: the idle tally stays honest.
    assert tally.snapshot()["events"] == before["events"]


def test_the_daemons_word_on_drives_is_its_own_states_only() -> None:
    view = busy_view(busy_activity())
    assert status.daemon_says(view) == {
        (100, "f0"): ("extending", None),
        (101, "f1"): ("failed", "lvextend failed"),
        (102, "f2"): ("deferred", "the VM is migrating"),
        (103, "f3"): ("held-by-reserve", "inside the VG's reserve"),
        (104, "f4"): ("paused-on-enospc", None),
    }
    # Rows a look can see for itself, and malformed rows, say nothing.
    assert status.daemon_says({"drives": [{"vmid": 1, "block_node": "f", "state": "armed"},
                                          {"vmid": "1", "block_node": "f", "state": "failed"},
                                          "junk"]}) == {}


def test_drives_says_when_it_has_no_daemon_view(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "storage.cfg").write_text("pvestord: t0\n\tvgname vg0\n")
    argv = ["drives", "--run-dir", str(tmp_path / "run"), "--storage-config",
            str(tmp_path / "storage.cfg"), "--status-file", str(tmp_path / "status.json")]
    assert main(argv) == 0
    out = capsys.readouterr()
    assert "(no thin drives on this node)" in out.out
    assert "no view published" in out.err and "this look's only" in out.err
    view = busy_view(busy_activity())
    view["time"] = __import__("time").time()
    status.publish(tmp_path / "status.json", view)
    assert main([*argv, "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out) == [] and out.err == ""


def test_what_the_daemon_asks_of_the_world_is_counted_and_published(tmp_path: Path) -> None:
    before = tally.snapshot()
    run(["true"], timeout=30)
    write_atomically(tmp_path / "queue", b"")
    after = tally.snapshot()
    assert after["commands"]["true"] == before["commands"].get("true", 0) + 1
    assert after["events"]["cluster_write"] == before["events"].get("cluster_write", 0) + 1
    view = busy_view(busy_activity())
    assert view["tally"] == after
    families = {f.name: f for f in text_string_to_metric_families(metrics.render(view))}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in families.values() for s in f.samples}
    assert samples[("pvestord_commands_started_total", (("program", "true"),))] == \
        after["commands"]["true"]
    assert samples[("pvestord_cluster_writes_total", ())] == after["events"]["cluster_write"]
    assert ("pvestord_qmp_sessions_total", ()) in samples
