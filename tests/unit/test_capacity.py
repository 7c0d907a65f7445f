"""The pure capacity accounting and guards (pvestord.policy.capacity)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pvestord.policy import capacity
from pvestord.policy.capacity import FreeThreshold, Guards, Level, LvUsage, Sample
from pvestord.policy.sizes import GiB, MiB

sizes = st.integers(min_value=0, max_value=1 << 44)
positive = st.integers(min_value=1, max_value=1 << 44)


def parsed(options: dict[str, str | None]) -> tuple[Guards, list[str]]:
    problems: list[str] = []
    guards = capacity.parse_guards(options, lambda option, _reason: problems.append(option))
    return guards, problems


def test_defaults_warn_at_ten_percent_refuse_at_five_and_reserve_one_chunk() -> None:
    guards, problems = parsed({})
    assert problems == []
    assert guards.warn_free.bytes_of(100 * GiB) == 10 * GiB
    assert guards.critical_free.bytes_of(100 * GiB) == 5 * GiB
    assert guards.max_overcommit is None
    assert guards.reserve_bytes(GiB) == GiB


def test_options_parse_shares_sizes_ratios_and_a_zero_reserve() -> None:
    guards, problems = parsed({"pvestord-thin-warn-free": "20%",
                               "pvestord-thin-critical-free": "50G",
                               "pvestord-max-overcommit": "2.5", "pvestord-thin-reserve": "0"})
    assert problems == []
    assert guards.warn_free == FreeThreshold(percent=20.0)
    assert guards.critical_free == FreeThreshold(size=50 * GiB)
    assert guards.max_overcommit == 2.5
    assert guards.reserve_bytes(GiB) == 0


@given(st.sampled_from(["pvestord-thin-warn-free", "pvestord-thin-critical-free",
                        "pvestord-max-overcommit", "pvestord-thin-reserve"]),
       st.one_of(st.none(), st.sampled_from(["", "abc", "-1", "101%", "1g", "0", "1.5x"])))
def test_an_unusable_value_is_reported_and_the_default_kept(option: str,
                                                            text: str | None) -> None:
    guards, problems = parsed({option: text})
    if problems:
        assert problems == [option]
        default = Guards()
        assert (guards.warn_free, guards.critical_free) == (default.warn_free,
                                                            default.critical_free) \
            or option in ("pvestord-max-overcommit", "pvestord-thin-reserve")


@given(positive, sizes, st.lists(st.tuples(sizes, st.one_of(st.none(), sizes), st.booleans()),
                                 max_size=20))
def test_account_sums_and_ratio(size: int, free_raw: int,
                                raw: list[tuple[int, int | None, bool]]) -> None:
    free = min(free_raw, size)
    lvs = [LvUsage(s, m, thin) for s, m, thin in raw]
    got = capacity.account("vg", size, free, lvs)
    thin = [lv for lv in lvs if lv.thin]
    assert got.thin_allocated == sum(lv.size for lv in thin)
    # A maximum never counts below what the LV already holds.
    assert got.thin_virtual >= got.thin_allocated
    assert got.unmeasured == sum(lv.maximum is None for lv in thin)
    assert got.overcommit == got.committed / size
    assert got.growth is None and got.time_to_full is None


def test_overcommit_counts_thick_lvs_at_their_size_and_thin_at_their_maximum() -> None:
    lvs = [LvUsage(10 * GiB, thin=False), LvUsage(GiB, 40 * GiB), LvUsage(GiB, 50 * GiB)]
    got = capacity.account("vg", 100 * GiB, 88 * GiB, lvs)
    assert got.committed == 100 * GiB
    assert got.overcommit == 1.0


@given(st.lists(st.tuples(st.floats(0, 7200), sizes), max_size=30), st.floats(0, 7200))
def test_growth_is_measured_inside_the_window_only(raw: list[tuple[float, int]],
                                                   now: float) -> None:
    samples = [Sample(at, allocated) for at, allocated in raw]
    grown = capacity.growth(samples, now)
    inside = sorted((s for s in samples if now - 3600 <= s.at <= now), key=lambda s: s.at)
    if grown is None:
        assert len(inside) < 2 or inside[-1].at - inside[0].at < capacity.MIN_GROWTH_SPAN
    else:
        gained, span = grown
        assert 0 < span <= 3600
        assert gained == inside[-1].allocated - inside[0].allocated


@given(st.lists(st.floats(0, 10000), max_size=30), st.floats(0, 10000))
def test_kept_samples_still_cover_the_window(times: list[float], now: float) -> None:
    samples = [Sample(t, 0) for t in times]
    kept = capacity.keep_samples(samples, now)
    assert all(s.at >= now - 3600 for s in kept[1:])
    assert {s.at for s in samples if s.at >= now - 3600} <= {s.at for s in kept}
    assert len(kept) <= len(samples)


@given(sizes, st.integers(1, 1 << 40), st.floats(1, 3600))
def test_time_to_full_at_the_measured_rate(free: int, gained: int, span: float) -> None:
    seconds = capacity.time_to_full(free, gained, span)
    assert seconds is not None
    assert abs(seconds * gained / span - free) <= max(free, 1) * 1e-9 + 1


def test_a_vg_that_does_not_fill_has_no_time_to_full() -> None:
    assert capacity.time_to_full(GiB, 0, 600) is None
    assert capacity.time_to_full(GiB, -GiB, 600) is None
    samples = [Sample(0, 10 * GiB), Sample(1800, 11 * GiB)]
    got = capacity.account("vg", 100 * GiB, 20 * GiB, [], samples, now=1800)
    assert got.growth == GiB and got.time_to_full == 20 * 1800


@given(positive, sizes)
def test_levels_are_ordered_by_free_space(size: int, free: int) -> None:
    guards = Guards()
    got = capacity.level(free, size, guards)
    assert (got is Level.CRITICAL) == (free < guards.critical_free.bytes_of(size))
    assert (got >= Level.WARN) == (free < guards.warn_free.bytes_of(size))


@given(st.lists(st.sampled_from(list(Level)), min_size=1, max_size=30))
def test_one_warning_per_crossing(levels: list[Level]) -> None:
    previous: Level | None = None
    warnings = 0
    for current in levels:
        warnings += capacity.warn_now(previous, current)
        previous = current
    crossings = sum(1 for before, after in zip([Level.OK, *levels], levels, strict=False)
                    if after > before)
    assert warnings == crossings


@given(positive, sizes, sizes, sizes)
def test_new_volumes_stop_at_critical_free(size: int, free_raw: int, lv_size: int,
                                           maximum: int) -> None:
    free = min(free_raw, size)
    acc = capacity.account("vg", size, free, [])
    refusal = capacity.new_volume_refusal(acc, Guards(), lv_size=lv_size, maximum=maximum,
                                          storeid="s")
    assert (refusal is not None) == (free - lv_size < Guards().critical_free.bytes_of(size))
    if refusal is not None:
        assert "pvestord-thin-critical-free" in refusal


def test_max_overcommit_caps_new_volumes() -> None:
    guards = Guards(max_overcommit=2.0)
    acc = capacity.account("vg", 100 * GiB, 90 * GiB, [LvUsage(10 * GiB, 150 * GiB)])
    assert capacity.new_volume_refusal(acc, guards, lv_size=GiB, maximum=50 * GiB,
                                       storeid="s") is None
    refusal = capacity.new_volume_refusal(acc, guards, lv_size=GiB, maximum=51 * GiB,
                                          storeid="s")
    assert refusal is not None and "pvestord-max-overcommit" in refusal


@given(sizes, st.integers(1, 1 << 40), sizes, st.booleans())
def test_an_extension_leaves_the_reserve_unless_a_vm_is_paused(
        free: int, grow_by: int, reserve: int, paused: bool) -> None:
    refusal = capacity.extension_refusal(vg_free=free, grow_by=grow_by, reserve=reserve,
                                         vm_paused_for_room=paused)
    if paused:
        assert refusal is None
    else:
        assert (refusal is None) == (free - grow_by >= reserve or grow_by > free)


def test_reserve_message_names_the_sizes() -> None:
    refusal = capacity.extension_refusal(vg_free=1536 * MiB, grow_by=GiB, reserve=GiB,
                                         vm_paused_for_room=False)
    assert refusal is not None and "512 MiB" in refusal and "1 GiB" in refusal


def test_storage_cfg_carries_the_guards_and_reports_bad_values() -> None:
    from pvestord.adapters.config import StorageOptionError, parse_storage_config
    text = ("pvestord: thin\n\tvgname vg0\n\tshared 1\n\tpvestord-thin-warn-free 20%\n"
            "\tpvestord-thin-critical-free 8G\n\tpvestord-max-overcommit 3\n"
            "\tpvestord-thin-reserve 2G\n")
    thin = parse_storage_config(text, "storage.cfg").thin_storages["thin"]
    assert thin.guards == Guards(FreeThreshold(percent=20.0), FreeThreshold(size=8 * GiB),
                                 3.0, 2 * GiB)
    try:
        parse_storage_config(text.replace("20%", "lots"), "storage.cfg")
    except StorageOptionError as err:
        assert [p.option for p in err.problems] == ["pvestord-thin-warn-free"]
    else:
        raise AssertionError("an unusable thin-warn-free was taken")


def test_a_new_volume_is_refused_below_critical_free(monkeypatch: object) -> None:
    import asyncio

    import pytest

    from pvestord.adapters import lvm
    from pvestord.adapters.config import parse_storage_config
    from pvestord.features.capacity import CapacityRefusedError, check_new_volume

    async def space(vg: str, **_: float) -> tuple[int, int]:
        return 100 * GiB, 6 * GiB

    async def lvs(vg: str, **_: float) -> list[lvm.LvRow]:
        return []

    patch = pytest.MonkeyPatch()
    patch.setattr(lvm, "vg_space", space)
    patch.setattr(lvm, "list_lvs", lvs)
    try:
        thin = parse_storage_config("pvestord: t0\n\tvgname vg0\n", "s").thin_storages["t0"]
        asyncio.run(check_new_volume(thin, lv_size=GiB // 2, maximum=GiB))
        with pytest.raises(CapacityRefusedError, match="pvestord-thin-critical-free"):
            asyncio.run(check_new_volume(thin, lv_size=2 * GiB, maximum=GiB))
    finally:
        patch.undo()


# --- the maximum recorded in an LV tag ---------------------------------------

#: LVM's tag characters (lvm(8), "TAGS"): what an admin's or another tool's tag may hold.
lvm_tag_text = st.text(alphabet="ABCXYZabcxyz0123456789_+.-/=!:#&", max_size=40)


@given(st.integers(min_value=1, max_value=10**19 - 1))
def test_a_recorded_maximum_reads_back_and_is_a_valid_lvm_tag(maximum: int) -> None:
    tag = capacity.maximum_tag(maximum)
    assert capacity.maximum_from_tags(["pve-vm-100", tag, "@pve-vm-100-disk-0.qcow2"]) == maximum
    # lvm(8): A-Z a-z 0-9 _ + . - / = ! : # &, at most 1024, no leading hyphen.
    assert len(tag) <= 1024 and not tag.startswith("-")
    assert all(c.isascii() and (c.isalnum() or c in "_+.-/=!:#&") for c in tag)


@pytest.mark.parametrize("maximum", [0, -1, 10**19])
def test_no_tag_is_written_for_a_maximum_it_could_not_read_back(maximum: int) -> None:
    with pytest.raises(ValueError, match="positive number of bytes"):
        capacity.maximum_tag(maximum)


@pytest.mark.parametrize("tag", [
    "pvestord-max-", "pvestord-max-0", "pvestord-max--5", "pvestord-max-+5", "pvestord-max- 5",
    "pvestord-max-5 ", "pvestord-max-1_0", "pvestord-max-\u0663", "pvestord-max-5\n",
    "pvestord-max-0x10", "pvestord-max-1e9", "pvestord-max-" + "9" * 20, "pvestord-max-5G",
    "PVESTORD-MAX-5", "xpvestord-max-5", "pve-max-5",
])
def test_hostile_or_foreign_tags_are_no_maximum(tag: str) -> None:
    assert capacity.maximum_from_tags([tag, "pve-vm-100"]) is None


@given(st.lists(st.one_of(lvm_tag_text, lvm_tag_text.map(lambda t: "pvestord-max-" + t),
                          st.text(max_size=30).map(lambda t: "pvestord-max-" + t))))
def test_any_tags_read_as_no_maximum_or_the_largest_plain_one(tags: list[str]) -> None:
    got = capacity.maximum_from_tags(tags)
    plain = [int(t[13:]) for t in tags if t.startswith("pvestord-max-")
             and t[13:].isascii() and t[13:].isdigit() and len(t[13:]) <= 19]
    assert got == (max(plain) if plain and max(plain) > 0 else None)


@given(st.lists(st.one_of(lvm_tag_text, lvm_tag_text.map(lambda t: "pvestord-max-" + t)),
                unique=True),
       st.integers(min_value=1, max_value=10**19 - 1))
def test_retagging_leaves_exactly_the_new_maximum_and_is_idempotent(tags: list[str],
                                                                   maximum: int) -> None:
    stale, new = capacity.retag_maximum(tags, maximum)
    after = [t for t in tags if t not in stale] + new
    assert capacity.maximum_from_tags(after) == maximum
    ours = [t for t in after if t.startswith("pvestord-max-")]
    assert ours == [capacity.maximum_tag(maximum)]
    # Other tags (Proxmox's pve-vm-<vmid>, pve-<volname>, an admin's) are kept.
    assert [t for t in tags if not t.startswith("pvestord-max-")] \
        == [t for t in after if not t.startswith("pvestord-max-")]
    assert capacity.retag_maximum(after, maximum) == ([], [])


# --- the same figures on every node ------------------------------------------

rows = st.lists(st.tuples(
    st.integers(min_value=0, max_value=50),                  # vmid
    st.integers(min_value=1, max_value=64).map(lambda n: n * 4 * MiB),  # LV size
    st.one_of(st.none(), st.integers(min_value=1, max_value=10**13)),  # recorded maximum
    st.booleans(),                                           # active on "this" node
    st.one_of(st.none(), st.integers(min_value=1, max_value=10**13)),  # measured here
), max_size=12, unique_by=lambda r: r[0])


@given(rows)
def test_tagged_lvs_give_every_node_the_same_account(lvs: list[tuple[int, int, int | None,
                                                                     bool, int | None]]) -> None:
    """Two nodes see the same VG metadata but each has its own LVs active and
    measured: for LVs that carry the tag the account must not depend on that;
    an untagged LV counts at its measure where one exists, else its size."""
    import asyncio

    from pvestord.adapters import lvm, vgspace

    vg_size = 10**15
    used = sum(size for _, size, _, _, _ in lvs)

    def listing(active_here: bool) -> list[lvm.LvRow]:
        return [lvm.LvRow("vg0", f"vm-{vmid}-disk-0.qcow2", size,
                          ("pve-vm-1",) + ((capacity.maximum_tag(rec),) if rec else ()),
                          active == active_here, False, "-")
                for vmid, size, rec, active, _ in lvs]

    def view(active_here: bool) -> capacity.Account:
        async def space(vg: str, **_: object) -> tuple[int, int]:
            return vg_size, vg_size - used

        async def list_lvs(vg: str, **_: object) -> list[lvm.LvRow]:
            return listing(active_here)

        measured = {f"vm-{vmid}-disk-0.qcow2": m for vmid, _, _, active, m in lvs
                    if m is not None and active == active_here}
        patch = pytest.MonkeyPatch()
        patch.setattr(lvm, "vg_space", space)
        patch.setattr(lvm, "list_lvs", list_lvs)
        try:
            return asyncio.run(vgspace.read_account("vg0", maxima=measured))
        finally:
            patch.undo()

    node_a, node_b = view(True), view(False)
    if all(rec is not None for _, _, rec, _, _ in lvs):
        assert node_a == node_b
        assert node_a.unmeasured == 0
        assert node_a.thin_virtual == sum(max(size, rec or 0) for _, size, rec, _, _ in lvs)
    for node, here in ((node_a, True), (node_b, False)):
        assert node.unmeasured == sum(1 for _, _, rec, active, m in lvs
                                      if rec is None and (m is None or active != here))
