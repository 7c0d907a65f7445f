"""The storage plugin's decisions (pvestord.features.plugin) and its request parsing."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pvestord.adapters import lvm, preparedjobs, qemu_img
from pvestord.adapters.config import PLUGIN_TYPE, StorageOptionError, parse_storage_config
from pvestord.errors import PvestordError
from pvestord.features import plugin
from pvestord.features.capacity import CapacityRefusedError
from pvestord.features.plugin import Kind
from pvestord.policy import templates
from pvestord.policy.capacity import COPY_TAG, maximum_tag
from pvestord.policy.sizes import GiB, MiB
from pvestord.policy.volumes import VolumeRole

extents = st.sampled_from([1 * MiB, 4 * MiB, 32 * MiB])
sizes = st.integers(min_value=1, max_value=64 * 1024 * GiB)


@given(initial=sizes, maximum=sizes, extent=extents)
def test_thin_alloc_is_initial_size_never_past_the_maximum(initial: int, maximum: int,
                                                           extent: int) -> None:
    size = plugin.alloc_lv_size(Kind.THIN, initial, maximum, extent)
    assert size % extent == 0
    assert size <= -(-maximum // extent) * extent
    assert size >= min(initial, maximum)


@given(initial=sizes, maximum=sizes, extent=extents)
def test_thick_alloc_holds_the_whole_image(initial: int, maximum: int, extent: int) -> None:
    size = plugin.alloc_lv_size(Kind.THICK, initial, maximum, extent)
    assert size % extent == 0
    assert maximum <= size < maximum + extent


def test_copy_flows_are_thick_everything_else_thin() -> None:
    assert plugin.allocation_kind(["PVE::Storage::vdisk_alloc",
                                   "PVE::QemuServer::clone_disk"]) is Kind.THICK
    assert plugin.allocation_kind(["PVE::Storage::vdisk_alloc",
                                   "PVE::QemuServer::ImportDisk::do_import"]) is Kind.THICK
    assert plugin.allocation_kind(["PVE::Storage::vdisk_alloc",
                                   "PVE::API2::Qemu::__ANON__"]) is Kind.THIN
    assert plugin.allocation_kind([]) is Kind.THIN


@given(lv=sizes, maximum=sizes, initial=sizes, extent=extents)
def test_resize_never_shrinks_and_never_makes_thick(lv: int, maximum: int, initial: int,
                                                    extent: int) -> None:
    lv = -(-lv // extent) * extent
    size = plugin.resize_lv_size(lv, maximum, initial, extent)
    assert size >= lv
    # Grown at most to a new disk's initial size: a thin LV stays thin.
    assert size == lv or size == plugin.alloc_lv_size(Kind.THIN, initial, maximum, extent)


@given(lv=sizes, end=sizes, maximum=sizes, chunk=st.integers(1 * MiB, 4 * GiB), extent=extents)
def test_commit_target_has_room_for_the_source_capped_at_maximum(
        lv: int, end: int, maximum: int, chunk: int, extent: int) -> None:
    lv = -(-lv // extent) * extent
    cap = -(-maximum // extent) * extent
    size = plugin.commit_lv_size(lv, end, maximum, chunk, extent)
    assert size >= lv
    assert size % extent == 0
    assert size >= min(lv + end + chunk, cap)
    assert size <= max(lv, cap)


def _request(**body: object) -> str:
    return json.dumps({"storage": {"storeid": "san1", "vgname": "vg_san1", "shared": 1,
                                   "options": {"pvestord-chunksize": "256M",
                                               "pvestord-chunk-percentage": 0.25,
                                               "pvestord-initial-size": "1G"}}, **body})


def test_request_carries_the_storage_options_as_proxmox_parsed_them() -> None:
    request = plugin.parse_request(_request(op="alloc", virtual_size=4 * GiB))
    assert (request.storage.chunksize, request.storage.chunk_percentage,
            request.storage.initial_size, request.storage.shared) == (256 * MiB, 0.25, GiB, True)
    assert request.integer("virtual_size") == 4 * GiB


def test_request_with_the_former_option_names_reads_the_same_values() -> None:
    """Sections written before the options took their prefix reach the plugin
    under their former names; the prefixed name wins when both are there."""
    former = plugin.parse_request(_request(op="alloc").replace('"pvestord-', '"'))
    assert (former.storage.chunksize, former.storage.chunk_percentage,
            former.storage.initial_size) == (256 * MiB, 0.25, GiB)
    both = plugin.parse_request(_request(op="alloc").replace(
        '"pvestord-chunksize": "256M"', '"pvestord-chunksize": "256M", "chunksize": "2G"'))
    assert both.storage.chunksize == 256 * MiB


@pytest.mark.parametrize("text", ["", "[]", '{"op": "grow"}', '{"op": "alloc"}',
                                  _request(op="alloc").replace("vg_san1", "vg san1")])
def test_malformed_requests_are_refused(text: str) -> None:
    with pytest.raises(PvestordError):
        plugin.parse_request(text)


def test_bad_thin_option_names_the_option() -> None:
    text = _request(op="alloc").replace('"256M"', '"256MB"')
    with pytest.raises(StorageOptionError, match="pvestord-chunksize = 256MB"):
        plugin.parse_request(text)


def test_resize_needs_a_positive_size() -> None:
    request = plugin.parse_request(_request(op="resize", lv="vm-100-disk-0.qcow2",
                                            virtual_size=0))
    with pytest.raises(plugin.PluginRequestError, match="virtual_size"):
        request.integer("virtual_size")


def test_plugin_section_is_thin_and_lvm_with_chunksize_warns() -> None:
    cfg = parse_storage_config(
        f"{PLUGIN_TYPE}: san1\n\tvgname vg1\n\tshared 1\n\tsnapshot-as-volume-chain 1\n\n"
        "lvm: san2\n\tvgname vg2\n\tpvestord-chunksize 1G\n", "storage.cfg")
    assert set(cfg.thin_storages) == {"san1", "san2"}
    assert cfg.thin_storages["san1"].chunksize == 1 * GiB  # the default
    warned = [w for w in cfg.warnings if "san2" in w]
    assert len(warned) == 1 and f"'{PLUGIN_TYPE}: san2'" in warned[0]
    assert not [w for w in cfg.warnings if "san1" in w]


# --- under the caller's storage lock ------------------------------------------------
#
# The plugin answers while Proxmox holds the storage lock, whose alarm aborts
# the holder before pmxcfs lets another node in: nothing slow may run, and the
# whole answer keeps to a share of what is left of that alarm.

#: A bound on a test that would otherwise hang on the old code; never reached.
HANG_GUARD = 60.0


@given(left=st.floats(min_value=0.001, max_value=3600.0))
def test_the_answer_budget_is_strictly_inside_the_lock_alarm(left: float) -> None:
    assert 0 < plugin.answer_budget(left) < left


def test_without_a_lock_alarm_the_answer_gets_what_cfs_lock_would_give() -> None:
    assert plugin.answer_budget(None) == plugin.UNTIMED_LOCK_BUDGET < 60


def test_lock_seconds_left_must_be_a_positive_number_or_null() -> None:
    assert plugin.parse_request(_request(op="resize")).lock_seconds_left is None
    assert plugin.parse_request(_request(op="resize", lock_seconds_left=59.5)
                                ).lock_seconds_left == 59.5
    with pytest.raises(plugin.PluginRequestError, match="lock_seconds_left"):
        _ = plugin.parse_request(_request(op="resize", lock_seconds_left="60")
                                 ).lock_seconds_left


class FakeWorld:
    """LVM and qemu-img as the plugin's answer sees them, every call recorded.
    An LV in ``hanging`` never answers, as a command stuck on a SAN."""

    def __init__(self, lv_sizes: dict[str, int], *, maximum: int, hanging: set[str]) -> None:
        self.lv_sizes = lv_sizes
        self.maximum = maximum
        self.hanging = hanging
        self.calls: list[tuple[str, str]] = []
        self.cancelled: list[str] = []
        #: LV tags beyond none, by LV (VG metadata: read whatever is active).
        self.tags: dict[str, tuple[str, ...]] = {}

    async def _call(self, what: str, lv: str) -> None:
        self.calls.append((what, lv))
        if lv in self.hanging:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.append(lv)
                raise

    async def lv_info(self, vg: str, lv: str, **_: object) -> lvm.LvInfo:
        await self._call("lvs", lv)
        return lvm.LvInfo(vg, lv, self.lv_sizes[lv], EXTENT, 100 * GiB, True, False,
                          self.tags.get(lv, ()))

    async def vg_info(self, vg: str, **_: object) -> lvm.VgInfo:
        return lvm.VgInfo(vg, EXTENT, 100 * GiB)

    async def vg_space(self, vg: str, **_: object) -> tuple[int, int]:
        return 200 * GiB, 100 * GiB

    async def list_lvs(self, vg: str, **_: object) -> list[lvm.LvRow]:
        return [lvm.LvRow(vg, lv, size, self.tags.get(lv, ()), lv != "vm-102-disk-0.qcow2",
                          False, "-")
                for lv, size in self.lv_sizes.items()]

    async def info(self, path: str, **_: object) -> qemu_img.ImageInfo:
        lv = path.rsplit("/", 1)[1]
        await self._call("qemu-img info", lv)
        return qemu_img.ImageInfo(path, "qcow2", 4 * GiB, None, 65536, False, 16, (),
                                  None, None, False, False)

    async def maximum_required(self, image: qemu_img.ImageInfo, **_: object) -> int:
        await self._call("qemu-img measure", image.filename.rsplit("/", 1)[1])
        return self.maximum

    async def measure(self, virtual_size: int, **_: object) -> qemu_img.Measure:
        await self._call("qemu-img measure", "")
        return qemu_img.Measure(self.maximum, self.maximum)

    async def check(self, path: str, **_: object) -> qemu_img.CheckResult:
        await self._call("qemu-img check", path.rsplit("/", 1)[1])
        return qemu_img.CheckResult(qemu_img.CheckStatus.CLEAN, GiB, None, None, None,
                                    0, 0, 0, "")


EXTENT = 4 * MiB
NEW_DISK = {"vmid": 100, "format": "qcow2", "name": "vm-100-disk-3.qcow2"}
TARGET, SOURCE = "snap_vm-100-disk-0_s1.qcow2", "vm-100-disk-0.qcow2"


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> FakeWorld:
    fake = FakeWorld({TARGET: 1 * GiB, SOURCE: 3 * GiB, "vm-101-disk-0.qcow2": 2 * GiB,
                      "vm-102-disk-0.qcow2": 2 * GiB}, maximum=5 * GiB, hanging=set())
    for name in ("lv_info", "vg_info", "vg_space", "list_lvs"):
        monkeypatch.setattr(lvm, name, getattr(fake, name))
    for name in ("info", "maximum_required", "measure", "check"):
        monkeypatch.setattr(qemu_img, name, getattr(fake, name))
    return fake


def _answer(text: str) -> dict[str, object]:
    async def bounded() -> dict[str, object]:
        return await asyncio.wait_for(plugin.answer(plugin.parse_request(text)), HANG_GUARD)
    return asyncio.run(bounded())


@pytest.mark.parametrize("running", [False, True])
def test_commit_takes_the_source_lv_size_and_never_checks_its_image(
        world: FakeWorld, running: bool) -> None:
    answer = _answer(_request(op="commit", target_lv=TARGET, source_lv=SOURCE,
                              virtual_size=4 * GiB, running=running, lock_seconds_left=60))
    # qemu-img check reads every table of the image: minutes under the lock.
    assert not [call for call in world.calls if call[0] == "qemu-img check"]
    assert ("lvs", SOURCE) in world.calls
    assert answer["lv_size"] == plugin.commit_lv_size(1 * GiB, 3 * GiB, 5 * GiB,
                                                      256 * MiB, EXTENT)
    assert answer["extend"] is True


@pytest.mark.parametrize("running", [False, True])
def test_a_commit_target_is_tagged_to_be_reduced_once_the_merge_is_over(
        world: FakeWorld, running: bool) -> None:
    """Grown for the merge, reduced after it (offline at once, a running VM's
    at its stop): a chain does not ratchet up to its maximum delete by delete."""
    world.tags = {TARGET: ("pve-vm-100", maximum_tag(5 * GiB))}
    answer = _answer(_request(op="commit", target_lv=TARGET, source_lv=SOURCE,
                              virtual_size=4 * GiB, running=running, lock_seconds_left=60))
    assert (answer["deltags"], answer["addtags"]) == ([], [COPY_TAG])


def test_an_answer_past_its_share_of_the_lock_alarm_gives_up_and_stops_its_commands(
        world: FakeWorld) -> None:
    world.hanging = {SOURCE}
    with pytest.raises(plugin.PluginTimeoutError, match=r"0\.05 s were left"):
        _answer(_request(op="commit", target_lv=TARGET, source_lv=SOURCE,
                         virtual_size=4 * GiB, running=False, lock_seconds_left=0.05))
    assert world.cancelled == [SOURCE]


def _capped(ratio: str, **body: object) -> str:
    return _request(op="alloc", lock_seconds_left=60, **body).replace(
        '"pvestord-initial-size": "1G"',
        f'"pvestord-initial-size": "1G", "pvestord-max-overcommit": "{ratio}"')


def test_max_overcommit_reads_the_recorded_maxima_and_measures_nothing(
        world: FakeWorld) -> None:
    """VG 200 GiB, 100 GiB free, 93 GiB of it thick (the snapshot LV among it).
    vm-102 is not active here (another node's VM): its recorded maximum of
    1000 GiB counts all the same, so every node judges the same commitment.
    Before the tag, only active LVs were measured (two qemu-img each, under
    the storage lock) and vm-102 counted at its 2 GiB: 0.55, allowed."""
    world.tags = {SOURCE: ("pve-vm-100", maximum_tag(5 * GiB)),
                  "vm-101-disk-0.qcow2": (maximum_tag(5 * GiB),),
                  "vm-102-disk-0.qcow2": (maximum_tag(1000 * GiB),)}
    with pytest.raises(CapacityRefusedError, match=r"overcommit to 5\.54"):
        _answer(_capped("5", virtual_size=4 * GiB, **NEW_DISK))
    # Only the new volume's own maximum is measured (no image there yet to read).
    assert [call for call in world.calls if call[0].startswith("qemu-img")] == [
        ("qemu-img measure", "")]
    assert _answer(_capped("6", virtual_size=4 * GiB, **NEW_DISK))["kind"] == "thin"


def test_an_lv_without_the_tag_counts_at_its_size_and_is_not_opened(world: FakeWorld) -> None:
    """An LV made before the tag, or by Proxmox's lvm type: its LV size,
    even when active here (measuring it would hold the lock for qemu-img)."""
    world.calls.clear()
    # Committed: 93 thick + 3 + 2 + 2 = 100 GiB; + 5 GiB new = 0.525 of 200 GiB.
    with pytest.raises(CapacityRefusedError, match=r"overcommit to 0\.53"):
        _answer(_capped("0.5", virtual_size=4 * GiB, **NEW_DISK))
    assert not [call for call in world.calls if call[0] == "qemu-img info"]


def test_an_alloc_records_the_new_volumes_maximum_in_a_tag(world: FakeWorld) -> None:
    answer = _answer(_request(op="alloc", virtual_size=4 * GiB, lock_seconds_left=60,
                              **NEW_DISK))
    assert answer["tags"] == ["pve-vm-100", "@pve-vm-100-disk-3.qcow2", maximum_tag(5 * GiB)]
    assert answer["maximum"] == 5 * GiB


def test_a_copy_target_is_thick_and_tagged_as_one(world: FakeWorld) -> None:
    """Thick while copying; the tag has the plugin reduce it once the copy is over."""
    answer = _answer(_request(op="alloc", virtual_size=4 * GiB, lock_seconds_left=60,
                              callers=["PVE::Storage::vdisk_alloc",
                                       "PVE::QemuServer::clone_disk"], **NEW_DISK))
    assert answer["kind"] == "thick"
    assert answer["lv_size"] == answer["maximum"] == 5 * GiB
    assert answer["tags"] == ["pve-vm-100", "@pve-vm-100-disk-3.qcow2", maximum_tag(5 * GiB),
                              COPY_TAG]


def test_the_plugin_reads_the_copy_tag_by_its_one_name() -> None:
    perl = (Path(__file__).resolve().parents[2] / "packaging" / "perl" / "PVE" / "Storage"
            / "Custom" / "PvestordPlugin.pm").read_text()
    assert f"my $COPY_TAG = '{COPY_TAG}';" in perl


@pytest.mark.parametrize("op", ["resize", "commit"])
def test_a_resize_or_commit_answers_the_tag_changes_of_the_new_maximum(
        world: FakeWorld, op: str) -> None:
    lv = SOURCE if op == "resize" else TARGET
    body: dict[str, object] = ({"lv": lv} if op == "resize"
                               else {"target_lv": lv, "source_lv": SOURCE, "running": False})
    # A commit's target is a copy target already (tagged by an earlier prepare).
    merge = (COPY_TAG,) if op == "commit" else ()
    world.tags = {lv: ("pve-vm-100", maximum_tag(3 * GiB), "pvestord-max-junk", *merge)}
    answer = _answer(_request(op=op, virtual_size=4 * GiB, lock_seconds_left=60, **body))
    assert answer["deltags"] == [maximum_tag(3 * GiB), "pvestord-max-junk"]
    assert answer["addtags"] == [maximum_tag(5 * GiB)]
    # Recorded already: no lvchange at all.
    world.tags = {lv: ("pve-vm-100", maximum_tag(5 * GiB), *merge)}
    answer = _answer(_request(op=op, virtual_size=4 * GiB, lock_seconds_left=60, **body))
    assert (answer["deltags"], answer["addtags"]) == ([], [])


def test_a_vm_state_is_a_plain_lv_of_the_size_asked(world: FakeWorld) -> None:
    size = 8 * GiB + 500 * MiB + 1024
    answer = _answer(_request(op="alloc", vmid=100, format="raw", name="vm-100-state-snap1",
                              virtual_size=size, lock_seconds_left=60))
    assert answer == {"name": "vm-100-state-snap1", "format": "raw",
                      "tags": ["pve-vm-100", maximum_tag(-(-size // EXTENT) * EXTENT)],
                      "lv_size": -(-size // EXTENT) * EXTENT,
                      "maximum": -(-size // EXTENT) * EXTENT, "kind": "plain",
                      "preallocation": "off"}
    # No image: nothing to measure.
    assert not [call for call in world.calls if call[0].startswith("qemu-img")]


def test_a_fleecing_image_is_thin_and_named_qcow2(world: FakeWorld) -> None:
    answer = _answer(_request(op="alloc", vmid=100, format="qcow2", name="vm-100-fleece-0",
                              virtual_size=10 * GiB + 512, lock_seconds_left=60,
                              callers=["PVE::VZDump::QemuServer::__ANON__"]))
    assert (answer["name"], answer["format"], answer["kind"]) == (
        "vm-100-fleece-0.qcow2", "qcow2", "thin")
    assert answer["tags"] == ["pve-vm-100", "@pve-vm-100-fleece-0.qcow2",
                              maximum_tag(5 * GiB)]
    assert answer["lv_size"] == 1 * GiB


@pytest.mark.parametrize("body", [
    {"vmid": 100, "format": "raw", "name": "vm-100-disk-0"},
    {"vmid": 100, "format": "qcow2", "name": "vm-100-disk-0"},
    {"vmid": 100, "format": "raw", "name": "vm-100-state-s1", "backing": True},
    {"vmid": 100, "format": "qcow2", "name": "vm-100-fleece-0", "backing": True},
    {"vmid": 100, "format": None, "name": "vm-100-disk-0.qcow2"},
    {"vmid": "100", "format": "qcow2", "name": "vm-100-disk-0.qcow2"},
    {"format": "qcow2", "name": "vm-100-disk-0.qcow2"},
    # Only a rollback's top replaces an LV, and only its own.
    {"vmid": 100, "format": "qcow2", "name": "vm-100-disk-0.qcow2",
     "replaces": "vm-100-disk-0.qcow2"},
    {"vmid": 100, "format": "qcow2", "name": "vm-100-disk-0.qcow2", "backing": True,
     "replaces": "vm-101-disk-0.qcow2"},
    {"vmid": 100, "format": "qcow2", "name": "vm-100-disk-0.qcow2", "backing": True,
     "replaces": "vm-100-disk-0.qcow2 --addtag x"},
])
def test_alloc_refuses_what_the_storage_does_not_hold(world: FakeWorld,
                                                      body: dict[str, object]) -> None:
    with pytest.raises(PvestordError):
        _answer(_request(op="alloc", virtual_size=GiB, lock_seconds_left=60, **body))
    assert world.calls == []


def test_a_rollbacks_top_is_judged_on_the_vg_without_the_top_it_replaces(
        world: FakeWorld) -> None:
    """100 GiB free: a new 1 GiB top leaves 99 GiB, below a critical free of
    100 GiB; the top it replaces (3 GiB) gives its room back, 102 GiB left."""
    text = _request(op="alloc", vmid=100, format="qcow2", name=SOURCE, backing=True,
                    virtual_size=4 * GiB, lock_seconds_left=60).replace(
        '"pvestord-initial-size": "1G"',
        '"pvestord-initial-size": "1G", "pvestord-thin-critical-free": "100G"')
    with pytest.raises(CapacityRefusedError, match="would have 99 GiB free"):
        _answer(text)
    replacing = _answer(text.replace('"backing": true', f'"backing": true, "replaces": "{SOURCE}"'))
    assert (replacing["name"], replacing["lv_size"]) == (SOURCE, 1 * GiB)


def test_a_vm_state_is_plain_whoever_allocates_it() -> None:
    assert plugin.allocation_kind(["PVE::QemuServer::clone_disk"],
                                  VolumeRole.VMSTATE) is Kind.PLAIN
    assert plugin.allocation_kind([], VolumeRole.FLEECE) is Kind.THIN


@given(size=sizes, extent=extents)
def test_a_plain_lv_holds_the_size_asked_in_whole_extents(size: int, extent: int) -> None:
    lv = plugin.alloc_lv_size(Kind.PLAIN, 1 * GiB, size, extent)
    assert lv % extent == 0
    assert size <= lv < size + extent


@pytest.mark.parametrize("running", [False, True])
def test_a_running_vms_commit_is_recorded_as_prepared_for_the_daemon(
        world: FakeWorld, running: bool, tmp_path: Path) -> None:
    folder = tmp_path / "prepared-jobs"

    async def bounded() -> dict[str, object]:
        request = plugin.parse_request(_request(
            op="commit", target_lv=TARGET, source_lv=SOURCE, virtual_size=4 * GiB,
            running=running, lock_seconds_left=60))
        return await asyncio.wait_for(plugin.answer(request, prepared_jobs=folder), HANG_GUARD)

    since = time.time()
    asyncio.run(bounded())
    # Only a running VM's delete is qemu-server's block job, which the daemon watches;
    # its record is this answer's (no older than the call, give or take a clock tick).
    recorded = preparedjobs.age(folder, "vg_san1", TARGET, now=since)
    assert (recorded is not None) is running
    assert recorded is None or recorded <= 1


TEMPLATE_BASE = "base-100-disk-0.qcow2"
CLONE = {"vmid": 101, "format": "qcow2", "name": "vm-101-disk-1.qcow2"}
CLONE_DISK = ["PVE::Storage::Plugin::clone_image", "PVE::Storage::vdisk_clone",
              "PVE::QemuServer::clone_disk"]


def test_a_linked_clone_is_thin_and_tagged_with_its_base(world: FakeWorld) -> None:
    answer = _answer(_request(op="alloc", virtual_size=4 * GiB, backing=True, parent=TEMPLATE_BASE,
                              callers=CLONE_DISK, lock_seconds_left=60, **CLONE))
    # clone_disk is a copy flow, yet nothing is copied into a linked clone.
    assert answer["kind"] == "thin"
    assert answer["lv_size"] == 1 * GiB
    assert answer["tags"] == ["pve-vm-101", "@pve-vm-101-disk-1.qcow2", maximum_tag(5 * GiB),
                              templates.parent_tag(TEMPLATE_BASE)]
    assert COPY_TAG not in answer["tags"]


@pytest.mark.parametrize(("body", "error"), [
    ({"backing": False, "parent": TEMPLATE_BASE}, plugin.PluginRequestError),
    ({"backing": True, "parent": "vm-100-disk-0.qcow2"}, templates.TemplateError),
    ({"backing": True, "parent": "base-100-disk-0.qcow2/x"}, lvm.LvmError),
])
def test_a_linked_clone_is_an_overlay_on_a_base(world: FakeWorld, body: dict[str, object],
                                                  error: type[Exception]) -> None:
    with pytest.raises(error):
        _answer(_request(op="alloc", virtual_size=4 * GiB, lock_seconds_left=60,
                         **body, **CLONE))


def test_a_base_is_renamed_and_records_its_size_as_its_maximum(world: FakeWorld) -> None:
    lv = "vm-101-disk-0.qcow2"
    world.tags = {lv: ("pve-vm-101", "@pve-vm-101-disk-0.qcow2", maximum_tag(5 * GiB),
                       COPY_TAG)}
    answer = _answer(_request(op="base", lv=lv, lock_seconds_left=60))
    assert answer == {
        "name": "base-101-disk-0.qcow2",
        "deltags": sorted(["@pve-vm-101-disk-0.qcow2", maximum_tag(5 * GiB), COPY_TAG]),
        "addtags": [maximum_tag(2 * GiB), "pve-base-101-disk-0.qcow2"]}


def test_a_disk_with_snapshot_lvs_is_no_base(world: FakeWorld) -> None:
    # The world holds snap_vm-100-disk-0_s1.qcow2, a snapshot of SOURCE.
    with pytest.raises(templates.TemplateError, match=r"snap_vm-100-disk-0_s1\.qcow2"):
        _answer(_request(op="base", lv=SOURCE, lock_seconds_left=60))
    with pytest.raises(templates.TemplateError):
        _answer(_request(op="base", lv="vm-100-state-s1", lock_seconds_left=60))
