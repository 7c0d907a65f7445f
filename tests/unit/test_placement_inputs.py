"""``pvestord placement`` on hand-edited files it cannot read: one line naming the
file and the field, exit status 1, no traceback.

Run as the installed command is, in a process of its own, so that a traceback
would show on its stderr.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ha_placement.events import parse_event
from ha_placement.inputs import InputError, read_sim_scenario
from tests.harness.placementbed import FIXTURES, write_pve_dir

#: The forum scenario's cluster folder; vm:101 runs on node3.
FACTS = FIXTURES / "forum-s2-keep-apart.json"


COMMAND = "import sys\nfrom pvestord.cli import main\nsys.exit(main(sys.argv[1:]))"


def placement(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", COMMAND, "placement", *args],  # noqa: S603
                          capture_output=True, text=True, check=False, timeout=60)


def assert_one_line_naming(done: subprocess.CompletedProcess[str], *names: str) -> None:
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("pvestord: ")
    for name in names:
        assert name in lines[0], lines[0]


def guest_config_not_utf8(pve: Path) -> str:
    conf = pve / "nodes" / "node3" / "qemu-server" / "101.conf"
    conf.write_bytes(b"memory: 2048\ndescription: caf\xe9\n")
    return "101.conf"


def max_restart_not_a_number(pve: Path) -> str:
    resources = pve / "ha" / "resources.cfg"
    resources.write_text(resources.read_text().replace(
        "vm: 101\n\tstate started\n", "vm: 101\n\tstate started\n\tmax_restart two\n"))
    return "resources.cfg"


def threshold_not_a_number(pve: Path) -> str:
    (pve / "datacenter.cfg").write_text(
        "crs: ha=static,ha-auto-rebalance=1,ha-auto-rebalance-threshold=high\n")
    return "datacenter.cfg"


@pytest.mark.parametrize(("spoil", "field"), [
    (guest_config_not_utf8, "UTF-8"),
    (max_restart_not_a_number, "max_restart"),
    (threshold_not_a_number, "ha-auto-rebalance-threshold"),
])
def test_a_cluster_folder_file_it_cannot_read_is_named_in_one_line(
        tmp_path: Path, spoil: Callable[[Path], str], field: str) -> None:
    pve = write_pve_dir(tmp_path / "pve", json.loads(FACTS.read_text()))
    file_name = spoil(pve)
    assert_one_line_naming(placement("--pve-dir", str(pve)), file_name, field)


def write_sim_test(folder: Path, service: dict[str, object],
                   datacenter: dict[str, object] | None = None) -> Path:
    folder.mkdir()
    (folder / "cmdlist").write_text(json.dumps([["power node1 on", "power node2 on"]]))
    (folder / "hardware_status").write_text(json.dumps({
        n: {"power": "off", "network": "off"} for n in ("node1", "node2")}))
    (folder / "service_config").write_text(json.dumps({"vm:101": service}))
    if datacenter is not None:
        (folder / "datacenter.cfg").write_text(json.dumps(datacenter))
    return folder


def test_a_simulator_folder_that_reads_is_run(tmp_path: Path) -> None:
    folder = write_sim_test(tmp_path / "sim", {"node": "node1", "state": "started"})
    done = placement("--sim-test", str(folder), "--json")
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(("service", "datacenter", "file_name", "field"), [
    ({"node": "node1", "state": "started", "max_restart": "two"}, None,
     "service_config", "max_restart"),
    ({"node": "node1", "state": "started"}, {"crs": {"ha-auto-rebalance-threshold": "high"}},
     "datacenter.cfg", "ha-auto-rebalance-threshold"),
])
def test_a_simulator_file_it_cannot_read_is_named_in_one_line(
        tmp_path: Path, service: dict[str, object], datacenter: dict[str, object] | None,
        file_name: str, field: str) -> None:
    folder = write_sim_test(tmp_path / "sim", service, datacenter)
    assert_one_line_naming(placement("--sim-test", str(folder)), file_name, field)


def test_a_simulator_file_not_in_utf8_is_named_in_one_line(tmp_path: Path) -> None:
    folder = write_sim_test(tmp_path / "sim", {"node": "node1", "state": "started"})
    (folder / "service_config").write_bytes(b'{"vm:101": {"node": "n\xe9ode1"}}')
    assert_one_line_naming(placement("--sim-test", str(folder)), "service_config", "UTF-8")


def test_events_given_with_a_simulator_folder_follow_its_first_step(tmp_path: Path) -> None:
    """What ``--sim-test DIR EVENT...`` plays: the power-on step, then the events given;
    with none, the whole cmdlist. ``--crs`` replaces the folder's."""
    folder = write_sim_test(tmp_path / "sim", {"node": "node1", "state": "started"},
                            {"crs": {"ha": "static"}})
    (folder / "cmdlist").write_text(json.dumps([["power node1 on", "power node2 on"],
                                                ["service vm:101 migrate node2"]]))
    cluster, events = read_sim_scenario(folder)
    assert (cluster.crs, len(events)) == ("static", 2)
    cluster, events = read_sim_scenario(folder, [parse_event("maintenance=node1")], "basic")
    assert cluster.crs == "basic"
    assert [e.label for e in events][1:] == ["maintenance=node1"]


def test_a_simulator_command_outside_the_model_names_the_folder(tmp_path: Path) -> None:
    folder = write_sim_test(tmp_path / "sim", {"node": "node1", "state": "started"})
    (folder / "cmdlist").write_text(json.dumps([["power node1 on"], ["disarm-ha freeze"]]))
    with pytest.raises(InputError, match=f"{folder}: the model does not cover disarm"):
        read_sim_scenario(folder)
