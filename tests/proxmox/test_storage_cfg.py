"""storage.cfg through Proxmox's real parser and writer with pvestord's plugin registered.

Runs on any machine with the Proxmox sources and the Perl modules (no LVM):
PVE::Storage::config() reads the file through the pmxcfs stand-in, and
PVE::Storage::Plugin->write_config (the writer PVE::Storage registers for
storage.cfg, what every GUI/API/pvesm edit ends in) writes it back.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pvestord.adapters.config import StorageOptionError, parse_storage_config
from pvestord.policy.sizes import GiB, MiB
from tests.proxmox import upstream

THIN = """\
pvestord: thin1
\tvgname vg_san1
\tcontent images
\tshared 1
\tsnapshot-as-volume-chain 1
\tpvestord-chunksize 256M
\tpvestord-chunk-percentage 0.25
\tpvestord-initial-size 1G

lvm: old
\tvgname vg_san2
\tshared 1
\tsnapshot-as-volume-chain 1
\tpvestord-chunksize 1G
"""



def test_round_trip_keeps_the_thin_options(proxmox: upstream.Upstream) -> None:
    proxmox.write_storage_cfg(THIN)
    first = proxmox.perl(upstream.READ_AND_WRITE)
    assert first.returncode == 0, first.stderr
    # Written once, read and written again: Proxmox's output is a fixed point.
    proxmox.write_storage_cfg(first.stdout)
    second = proxmox.perl(upstream.READ_AND_WRITE)
    assert second.returncode == 0, second.stderr
    def thin_options(text: str) -> dict[str, str | None]:
        return dict(parse_storage_config(text, "storage.cfg").lvm_storages["thin1"].options)

    assert thin_options(second.stdout) == thin_options(first.stdout) == thin_options(THIN)
    assert "thin1" not in first.stderr + second.stderr  # no warning about our section
    ids = proxmox.perl_json('print encode_json(PVE::Storage::config()->{ids}{thin1});')
    assert ids["type"] == "pvestord"
    assert (ids["pvestord-chunksize"], float(ids["pvestord-chunk-percentage"]),
            ids["pvestord-initial-size"]) == ("256M", 0.25, "1G")
    # pvestord reads what Proxmox wrote as the same thin storage.
    cfg = parse_storage_config(second.stdout, "storage.cfg")
    thin = cfg.thin_storages["thin1"]
    assert (thin.vgname, thin.chunksize, thin.chunk_percentage, thin.initial_size,
            thin.shared) == ("vg_san1", 256 * MiB, 0.25, 1 * GiB, True)


def test_lvm_section_loses_chunksize_and_pvestord_says_what_to_change(
        proxmox: upstream.Upstream) -> None:
    proxmox.write_storage_cfg(THIN)
    done = proxmox.perl(upstream.READ_AND_WRITE)
    assert done.returncode == 0, done.stderr
    assert "unexpected property 'pvestord-chunksize'" in done.stderr
    written = parse_storage_config(done.stdout, "storage.cfg")
    assert "pvestord-chunksize" not in written.lvm_storages["old"].options
    # Before Proxmox rewrote it, pvestord still took it as thin, and warned.
    before = parse_storage_config(THIN, "storage.cfg")
    assert before.thin_storages["old"].chunksize == 1 * GiB
    assert any("'pvestord: old'" in w for w in before.warnings)


@pytest.mark.parametrize(("line", "bad"), [
    ("pvestord-chunksize 256M", "pvestord-chunksize 256MB"),
    ("pvestord-initial-size 1G", "pvestord-initial-size 1 G"),
    ("pvestord-chunk-percentage 0.25", "pvestord-chunk-percentage 1.5")])
def test_proxmox_refuses_what_pvestord_refuses(proxmox: upstream.Upstream, line: str,
                                                bad: str) -> None:
    option = line.split()[0]
    text = THIN.replace(f"\t{line}\n", f"\t{bad}\n", 1)
    assert bad in text
    proxmox.write_storage_cfg(text)
    done = proxmox.perl(upstream.READ_AND_WRITE)
    assert done.returncode == 0, done.stderr
    assert f"unable to parse value of '{option}'" in done.stderr
    assert bad not in done.stdout
    with pytest.raises(StorageOptionError, match=option):
        parse_storage_config(text, "storage.cfg")


def test_section_without_volume_chain_is_refused(proxmox: upstream.Upstream) -> None:
    proxmox.write_storage_cfg(THIN.replace("\tsnapshot-as-volume-chain 1\n", "", 1))
    done = proxmox.perl(upstream.READ_AND_WRITE)
    assert "missing value for required option 'snapshot-as-volume-chain'" in done.stderr
    assert "thin1" not in done.stdout


def test_plugin_answers_the_loader_checks(proxmox: upstream.Upstream,
                                          tmp_path: Path) -> None:
    """What upstream's loader checks of a custom plugin: derived from Plugin, api()
    within [APIVER - APIAGE, APIVER]."""
    found = proxmox.perl_json(
        'my $m = "PVE::Storage::Custom::PvestordPlugin";'
        'print encode_json({isa => $m->isa("PVE::Storage::LVMPlugin") ? 1 : 0,'
        ' api => $m->api(), apiver => PVE::Storage::APIVER, apiage => PVE::Storage::APIAGE,'
        ' formats => $m->get_formats()});')
    assert found["isa"] == 1
    assert found["apiver"] - found["apiage"] <= found["api"] <= found["apiver"]
    assert found["formats"] == {"default": "qcow2", "valid": {"qcow2": 1}}
