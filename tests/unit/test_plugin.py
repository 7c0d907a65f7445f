"""The storage plugin's decisions (pvestord.features.plugin) and its request parsing."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pvestord.adapters.config import PLUGIN_TYPE, StorageOptionError, parse_storage_config
from pvestord.errors import PvestordError
from pvestord.features import plugin
from pvestord.features.plugin import Kind
from pvestord.policy.sizes import GiB, MiB

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
                                   "options": {"chunksize": "256M", "chunk-percentage": 0.25,
                                               "initial-size": "1G"}}, **body})


def test_request_carries_the_storage_options_as_proxmox_parsed_them() -> None:
    request = plugin.parse_request(_request(op="alloc", virtual_size=4 * GiB))
    assert (request.storage.chunksize, request.storage.chunk_percentage,
            request.storage.initial_size, request.storage.shared) == (256 * MiB, 0.25, GiB, True)
    assert request.integer("virtual_size") == 4 * GiB


@pytest.mark.parametrize("text", ["", "[]", '{"op": "grow"}', '{"op": "alloc"}',
                                  _request(op="alloc").replace("vg_san1", "vg san1")])
def test_malformed_requests_are_refused(text: str) -> None:
    with pytest.raises(PvestordError):
        plugin.parse_request(text)


def test_bad_thin_option_names_the_option() -> None:
    text = _request(op="alloc").replace('"256M"', '"256MB"')
    with pytest.raises(StorageOptionError, match="chunksize = 256MB"):
        plugin.parse_request(text)


def test_resize_needs_a_positive_size() -> None:
    request = plugin.parse_request(_request(op="resize", lv="vm-100-disk-0.qcow2",
                                            virtual_size=0))
    with pytest.raises(plugin.PluginRequestError, match="virtual_size"):
        request.integer("virtual_size")


def test_plugin_section_is_thin_and_lvm_with_chunksize_warns() -> None:
    cfg = parse_storage_config(
        f"{PLUGIN_TYPE}: san1\n\tvgname vg1\n\tshared 1\n\tsnapshot-as-volume-chain 1\n\n"
        "lvm: san2\n\tvgname vg2\n\tchunksize 1G\n", "storage.cfg")
    assert set(cfg.thin_storages) == {"san1", "san2"}
    assert cfg.thin_storages["san1"].chunksize == 1 * GiB  # the default
    warned = [w for w in cfg.warnings if "san2" in w]
    assert len(warned) == 1 and f"'{PLUGIN_TYPE}: san2'" in warned[0]
    assert not [w for w in cfg.warnings if "san1" in w]
