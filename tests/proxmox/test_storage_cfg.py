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


#: An ``lvm:`` section as Proxmox writes it with volume chains off (the lvm
#: type's default), and the same one with its header changed to ``pvestord:``.
LVM_WITHOUT_CHAIN = "lvm: plain\n\tvgname vg_san3\n\tcontent images\n\tshared 1\n"
CONVERTED = "pvestord: converted\n\tvgname vg_san3\n\tcontent images\n\tshared 1\n"


def test_converted_section_without_volume_chain_is_kept_with_it(
        proxmox: upstream.Upstream) -> None:
    """SectionConfig empties a section missing a required option: the storage
    vanishes and every write of storage.cfg (any storage edit) dies "unknown
    section type ''". A ``pvestord:`` section without ``snapshot-as-volume-chain``
    gets the only value it has, and is written back with it."""
    proxmox.write_storage_cfg(f"{CONVERTED}\n{LVM_WITHOUT_CHAIN}")
    done = proxmox.perl(upstream.READ_AND_WRITE)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    written = parse_storage_config(done.stdout, "storage.cfg")
    assert written.lvm_storages["converted"].options["snapshot-as-volume-chain"] == "1"
    # Proxmox's own types are left as they are: no default for an lvm: section.
    assert "snapshot-as-volume-chain" not in written.lvm_storages["plain"].options
    ids = proxmox.perl_json('my $ids = PVE::Storage::config()->{ids};'
                            'print encode_json([$ids->{converted}, $ids->{plain}]);')
    assert ids[0]["type"] == "pvestord"
    assert ids[0]["snapshot-as-volume-chain"] == 1
    assert ids[0]["vgname"] == "vg_san3"
    assert ids[1]["type"] == "lvm"
    assert "snapshot-as-volume-chain" not in ids[1]


def test_section_with_volume_chain_off_is_kept_and_refused_when_used(
        proxmox: upstream.Upstream) -> None:
    """Written by hand as 0: kept (not emptied), but no task runs on it."""
    proxmox.write_storage_cfg(THIN.replace("snapshot-as-volume-chain 1",
                                           "snapshot-as-volume-chain 0", 1))
    done = proxmox.perl(upstream.READ_AND_WRITE)
    assert done.returncode == 0, done.stderr
    assert "pvestord: thin1\n" in done.stdout
    found = proxmox.perl_json(
        # LVM recorded, never run on this machine: with no VG state given, any
        # LVM command the refusal let through dies instead.
        'require PvestordTest::LvmRecorder; PvestordTest::LvmRecorder::install();'
        'my $cfg = PVE::Storage::config();'
        'my $volid = eval { PVE::Storage::vdisk_alloc($cfg, "thin1", 100, "qcow2", "", 1024) };'
        'my $alloc = "$@";'
        'eval { PVE::Storage::activate_volumes($cfg, ["thin1:vm-100-disk-0.qcow2"]) };'
        'print encode_json({volid => $volid, alloc => $alloc, activate => "$@"});')
    message = ("storage 'thin1': type 'pvestord' needs 'snapshot-as-volume-chain 1' (its disks"
               " are qcow2 volume chains): set it in /etc/pve/storage.cfg\n")
    assert found == {"volid": None, "alloc": message, "activate": message}


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
