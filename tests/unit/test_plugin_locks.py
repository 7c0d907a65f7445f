"""Which storage locks the Proxmox plugin takes, and its refusal on a marked VG
(pvestord.policy.vglocks, pvestord.features.pluginlocks, ``pvestord plugin``'s
``locks`` op)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pvestord.adapters.config import parse_storage_config
from pvestord.adapters.vghealth import VgMarks
from pvestord.errors import PvestordError
from pvestord.features import pluginlocks
from pvestord.policy import vglocks

REPO = Path(__file__).resolve().parents[2]
ids = st.from_regex(r"[a-z][a-z0-9]{0,6}", fullmatch=True)
booleans_as_written = st.sampled_from([None, "0", "1", "yes", "no", "maybe"])
sections = st.lists(st.tuples(
    st.sampled_from(["lvm", "pvestord", "lvmthin", "dir", "rbd"]), ids,
    st.fixed_dictionaries({"vgname": st.sampled_from(["san", "other"])},
                          optional={"shared": booleans_as_written,
                                    "disable": booleans_as_written})),
    max_size=8, unique_by=lambda s: s[1])


@given(sections=sections, storeid=ids, shared=st.booleans())
def test_the_plugin_locks_its_own_storage_and_every_enabled_one_on_the_vg_sorted(
        sections: list[vglocks.SectionView], storeid: str, shared: bool) -> None:
    locks = vglocks.locks_for(sections, "san", storeid, shared)
    names = [name for name, _ in locks]
    # One global order (the daemon's): no two holders can deadlock.
    assert names == sorted(set(names))
    assert (storeid, shared) in locks
    for kind, other, options in sections:
        on_vg = kind in vglocks.LVM_TYPES and options["vgname"] == "san"
        # A bare key is set; an unreadable value is read the safe way.
        disabled = "disable" in options and options["disable"] in (None, "1", "yes")
        unshared = "shared" not in options or options["shared"] in ("0", "no")
        if other == storeid:
            continue
        if on_vg and not disabled:
            assert (other, not unshared) in locks
        else:
            assert other not in names

STORAGE_CFG = """\
lvm: thick1
\tvgname san
\tshared 1

pvestord: thin1
\tvgname san
\tshared 1
\tsnapshot-as-volume-chain 1

lvm: old
\tvgname san
\tdisable 1

lvm: elsewhere
\tvgname other
"""


def _request(storeid: str = "thin1", vgname: str = "san") -> dict[str, object]:
    """As the Perl sends it: the sections as PVE::Storage parsed them (numbers)."""
    config = parse_storage_config(STORAGE_CFG, "storage.cfg")
    return {"op": "locks", "storage": {"storeid": storeid, "vgname": vgname, "shared": 1},
            "storages": [{"storeid": s.id, "type": s.type,
                          **{k: int(v) if v and v.isdigit() else v
                             for k, v in s.options.items()}} for s in config.sections]}


def test_the_plugin_and_the_daemon_lock_the_same_storages(tmp_path: Path) -> None:
    request = pluginlocks.parse_locks_request(_request())
    answer = pluginlocks.answer_locks(request, VgMarks(tmp_path))
    daemon = parse_storage_config(STORAGE_CFG, "storage.cfg").vg_users("san")
    assert [(lock["storeid"], lock["shared"]) for lock in answer["locks"]] == daemon
    assert daemon == [("thick1", True), ("thin1", True)]
    assert answer["health_mark"] == str(tmp_path / "san")


def test_a_vg_marked_on_this_node_is_refused_with_the_mark_and_the_runbook(
        tmp_path: Path) -> None:
    health = VgMarks(tmp_path)
    health.mark("san", "lvextend (pid 4242) did not end after SIGKILL")
    with pytest.raises(pluginlocks.VgMarkedError) as refused:
        pluginlocks.answer_locks(pluginlocks.parse_locks_request(_request()), health)
    message = str(refused.value)
    assert str(tmp_path / "san") in message
    assert "pid 4242" in message
    assert "operations.md" in message
    # Another VG is not held back.
    answer = pluginlocks.answer_locks(
        pluginlocks.parse_locks_request(_request("elsewhere", "other")), health)
    assert [lock["storeid"] for lock in answer["locks"]] == ["elsewhere"]


@pytest.mark.parametrize("request_", [
    {"op": "locks"},
    {"op": "locks", "storage": {"storeid": "a", "vgname": "san"}},
    {"op": "locks", "storage": {"storeid": "a", "vgname": "san"}, "storages": [{"type": "lvm"}]},
    {"op": "locks", "storage": {"storeid": "a", "vgname": "-bad"}, "storages": []},
])
def test_malformed_locks_requests_are_refused(request_: dict[str, object]) -> None:
    with pytest.raises(PvestordError, match=r"locks|VG"):
        pluginlocks.parse_locks_request(request_)


def test_the_command_answers_the_locks_op(tmp_path: Path) -> None:
    done = subprocess.run(  # noqa: S603 - argument list
        [str(Path(sys.executable).parent / "pvestord"), "plugin", "--vg-health-dir",
         str(tmp_path)], input=json.dumps(_request()), env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert [lock["storeid"] for lock in json.loads(done.stdout)["locks"]] == ["thick1", "thin1"]
