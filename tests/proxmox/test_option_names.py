"""pvestord's option names beside Proxmox's own: the plugin must load whatever
names Proxmox's LVM plugin comes to declare, and sections written with our
former, unprefixed names must keep their values.

``PvestordTest::LvmDeclaresThinOptions`` (a test stand-in) makes the real
LVMPlugin declare ``chunksize`` and ``chunk-percentage`` before PVE::Storage
registers its plugins: SectionConfig dies on a property two plugins declare.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pvestord.adapters.config import parse_storage_config
from pvestord.policy.sizes import GiB, MiB
from tests.proxmox import upstream

LVM_DECLARES_THIN_OPTIONS = ("PvestordTest::LvmDeclaresThinOptions",)

PREFIXED = """\
pvestord: thin1
\tvgname vg_san1
\tcontent images
\tshared 1
\tsnapshot-as-volume-chain 1
\tpvestord-chunksize 256M
\tpvestord-chunk-percentage 0.25
\tpvestord-initial-size 1G
\tpvestord-thin-reserve 4G

lvm: thick
\tvgname vg_san2
\tshared 1
"""

FORMER = """\
pvestord: thin1
\tvgname vg_san1
\tcontent images
\tshared 1
\tsnapshot-as-volume-chain 1
\tchunksize 256M
\tchunk-percentage 0.25
\tinitial-size 1G
\tthin-reserve 4G
"""



def round_trip(proxmox: upstream.Upstream, text: str, preload: tuple[str, ...]
               ) -> tuple[str, str]:
    """Proxmox's storage.cfg after one read and write, and after a second
    (stdout); every warning Perl gave (stderr)."""
    proxmox.write_storage_cfg(text)
    first = proxmox.perl(upstream.READ_AND_WRITE, preload=preload)
    assert first.returncode == 0, first.stderr
    proxmox.write_storage_cfg(first.stdout)
    second = proxmox.perl(upstream.READ_AND_WRITE, preload=preload)
    assert second.returncode == 0, second.stderr
    assert thin1_options(second.stdout) == thin1_options(first.stdout)  # a fixed point
    return second.stdout, first.stderr + second.stderr


def thin1_options(text: str) -> dict[str, str | None]:
    return dict(parse_storage_config(text, "storage.cfg").lvm_storages["thin1"].options)


def test_the_stand_in_lvm_declares_the_former_names(proxmox: upstream.Upstream) -> None:
    """Without our plugin, the stand-in's LVMPlugin loads and keeps its options."""
    proxmox.write_storage_cfg("lvm: thick\n\tvgname vg_san2\n\tchunksize 1G\n")
    done = proxmox.perl(
        'print encode_json([sort grep { /chunk/ }'
        ' keys PVE::Storage::Plugin->private()->{propertyList}->%*]);',
        preload=LVM_DECLARES_THIN_OPTIONS, PVESTORD_TEST_NO_REGISTER="1")
    assert done.returncode == 0, done.stderr
    assert done.stdout == '["chunk-percentage","chunksize"]'


def test_storage_loads_when_lvm_declares_the_former_names(
        proxmox: upstream.Upstream) -> None:
    written, warned = round_trip(proxmox, PREFIXED, LVM_DECLARES_THIN_OPTIONS)
    assert "duplicate property" not in warned
    assert "thin1" not in warned  # nothing about our section
    assert thin1_options(written) == thin1_options(PREFIXED)
    thin = parse_storage_config(written, "storage.cfg").thin_storages["thin1"]
    assert (thin.chunksize, thin.chunk_percentage, thin.initial_size,
            thin.guards.reserve) == (256 * MiB, 0.25, 1 * GiB, 4 * GiB)


@pytest.mark.parametrize("preload", [(), LVM_DECLARES_THIN_OPTIONS],
                         ids=["lvm-as-released", "lvm-declares-chunksize"])
def test_sections_with_the_former_names_keep_their_values(
        proxmox: upstream.Upstream, preload: tuple[str, ...]) -> None:
    written, warned = round_trip(proxmox, FORMER, preload)
    assert "thin1" not in warned
    # Proxmox kept every option, whichever plugin declares its name...
    assert thin1_options(written) == thin1_options(FORMER)
    # ... and pvestord reads them as the prefixed ones, saying they are deprecated.
    cfg = parse_storage_config(written, "storage.cfg")
    thin = cfg.thin_storages["thin1"]
    assert (thin.chunksize, thin.chunk_percentage, thin.initial_size,
            thin.guards.reserve) == (256 * MiB, 0.25, 1 * GiB, 4 * GiB)
    assert any("'chunksize' is deprecated, read as 'pvestord-chunksize'" in w
               for w in cfg.warnings)


def test_plugin_declares_each_name_once(proxmox: upstream.Upstream) -> None:
    """Our former names are declared by us only where no other plugin declares them."""
    found = proxmox.perl_json(
        'print encode_json([sort grep { /chunk/ }'
        ' keys PVE::Storage::Custom::PvestordPlugin->properties()->%*]);',
        )
    assert found == ["chunk-percentage", "chunksize", "pvestord-chunk-percentage",
                     "pvestord-chunksize"]
    done = proxmox.perl(
        'print encode_json([sort grep { /chunk/ }'
        ' keys PVE::Storage::Custom::PvestordPlugin->properties()->%*]);',
        preload=LVM_DECLARES_THIN_OPTIONS)
    assert done.returncode == 0, done.stderr
    assert done.stdout == '["pvestord-chunk-percentage","pvestord-chunksize"]'


def test_the_plugin_hands_pvestord_both_names(proxmox: upstream.Upstream,
                                              tmp_path: Path) -> None:
    """The Perl passes on whatever names the section uses; pvestord picks."""
    request = tmp_path / "request.json"
    recorder = upstream.plugin_stand_in(tmp_path / "pvestord",
                                        f"printf '%s' \"$request\" > {request}\nexit 1",
                                        tmp_path / "vg-unhealthy")
    proxmox.write_storage_cfg(FORMER.replace("\tinitial-size 1G\n",
                                             "\tpvestord-initial-size 2G\n"))
    done = proxmox.perl(
        'my $cfg = PVE::Storage::config();'
        'eval { PVE::Storage::volume_resize($cfg, "thin1:vm-100-disk-0.qcow2",'
        ' 8 * 1024**3, 1) };'
        'print "$@";', preload=LVM_DECLARES_THIN_OPTIONS, PVESTORD_TEST_COMMAND=str(recorder))
    assert done.returncode == 0, done.stderr
    assert "pvestord plugin resize" in done.stdout
    options = json.loads(request.read_text())["storage"]["options"]
    assert options == {"chunksize": "256M", "chunk-percentage": "0.25",
                       "pvestord-initial-size": "2G", "thin-reserve": "4G"}
