"""storage.cfg parsing (as PVE::SectionConfig parses it) and our lvm options."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pvestord.adapters.config import StorageOptionError, load_storage_config, parse_storage_config
from pvestord.adapters.settings import DaemonSettings
from pvestord.errors import ConfigError
from pvestord.policy.sizes import GiB, MiB

# A Proxmox VE 9 node's file, tab-indented as Proxmox writes it, with two
# shared LVM storages on a SAN (one thin-enabled) and one plugin we don't know.
REAL = """\
dir: local
\tpath /var/lib/vz
\tcontent iso,vztmpl,backup

lvmthin: local-lvm
\tthinpool data
\tvgname pve
\tcontent rootdir,images

# the SAN, thin-provisioned qcow2 on thick LVM
lvm: san1
\tvgname vg_san1
\tcontent images
\tshared 1
\tsnapshot-as-volume-chain 1
\tchunksize 256M
\tchunk-percentage 0.25
\tinitial-size 1G

lvm: san2
\tvgname vg_san2
\tcontent images,rootdir
\tshared 1
\tsaferemove 0

pbs: backup
\tdatastore store1
\tserver 10.0.0.5
\tcontent backup
\tusername root@pam
"""


def test_real_file() -> None:
    cfg = parse_storage_config(REAL, "storage.cfg")
    assert [s.id for s in cfg.sections] == ["local", "local-lvm", "san1", "san2", "backup"]
    assert [s.type for s in cfg.sections] == ["dir", "lvmthin", "lvm", "lvm", "pbs"]
    assert list(cfg.lvm_storages) == ["san1", "san2"]
    assert list(cfg.thin_storages) == ["san1"]
    san1 = cfg.get("san1")
    assert san1 is not None
    assert (san1.storeid, san1.vgname, san1.chunksize, san1.chunk_percentage,
            san1.initial_size, san1.shared) == ("san1", "vg_san1", 256 * MiB, 0.25, GiB, True)
    # Unknown options are kept as written.
    assert san1.options["snapshot-as-volume-chain"] == "1"
    assert san1.options["content"] == "images"
    assert cfg.get("san2") is None  # an lvm storage without chunksize is not thin
    san2 = cfg.lvm_storages["san2"]
    assert san2.thin is None and san2.shared and san2.options["saferemove"] == "0"
    assert cfg.get("local") is None and cfg.get("nope") is None
    assert cfg.by_vg("vg_san1") == san1
    assert cfg.by_vg("vg_san2") is None and cfg.by_vg("pve") is None
    # Other sections are kept, not interpreted.
    backup = cfg.sections[-1]
    assert backup.options == {"datastore": "store1", "server": "10.0.0.5",
                              "content": "backup", "username": "root@pam"}
    # The thin lvm: section still works but is told to become a pvestord: section.
    assert len(cfg.warnings) == 1 and "'pvestord: san1'" in cfg.warnings[0]


def test_defaults_when_only_chunksize() -> None:
    cfg = parse_storage_config("lvm: s0\n\tvgname vg\n\tchunksize 1G\n", "t")
    thin = cfg.get("s0")
    assert thin is not None
    assert (thin.chunksize, thin.chunk_percentage, thin.initial_size, thin.shared) == (
        GiB, 0.5, 2 * GiB, False)


def test_space_indentation_comments_crlf_and_case() -> None:
    text = ("# header comment\n"
            "PVESTORD:   s1  \r\n"  # the plugin type; lvm: + chunksize warns
            "    vgname   vg1\r\n"
            "  # a comment inside a section does not end it\n"
            "    chunksize 512M   \r\n"
            "    shared\n"          # a bare key is a boolean 1
            "\n"
            "lvm: s2\n\tvgname vg2\n")
    cfg = parse_storage_config(text, "t")
    s1 = cfg.get("s1")
    assert s1 is not None and s1.vgname == "vg1" and s1.chunksize == 512 * MiB and s1.shared
    assert "s2" in cfg.lvm_storages
    assert cfg.warnings == ()


def test_single_character_ids_are_invalid_as_in_proxmox() -> None:
    # parse_storage_id: ^[a-z][a-z0-9\-_.]*[a-z0-9]$ needs two characters.
    cfg = parse_storage_config("lvm: a\n\tvgname va\n\tchunksize 1G\n", "t")
    assert dict(cfg.lvm_storages) == {}
    assert "storage ID 'a' contains illegal characters" in cfg.warnings[0]


def test_file_without_trailing_newline_and_empty_file() -> None:
    cfg = parse_storage_config("lvm: s0\n\tvgname vg\n\tchunksize 1G", "t")
    assert cfg.get("s0") is not None
    empty = parse_storage_config("", "t")
    assert empty.sections == () and dict(empty.lvm_storages) == {}


def test_blank_only_line_does_not_end_a_section_as_in_proxmox() -> None:
    # SectionConfig ends a section only at an empty line; a line of blanks is
    # a malformed option line, so the next header is swallowed as one too.
    text = "lvm: a0\n\tvgname va\n\t\nlvm: b\n\tvgname vb\n"
    cfg = parse_storage_config(text, "t")
    assert list(cfg.lvm_storages) == ["a0"]
    assert len(cfg.warnings) == 3  # the blank line, "lvm: b" and its option
    assert "line 3" in cfg.warnings[0] and "line 4" in cfg.warnings[1]


def test_malformed_lines_warn_and_keep_the_rest() -> None:
    text = ("stray line\n\n"
            "lvm: bad!id\n\tvgname vg\n\tchunksize 1G\n\n"
            "lvm: ok\n\tvgname vg\n\tchunksize 1G\n\tchunksize 2G\n\n"
            "lvm: ok\n\tvgname other\n")
    cfg = parse_storage_config(text, "f.cfg")
    ok = cfg.get("ok")
    assert ok is not None and ok.chunksize == GiB and ok.vgname == "vg"  # first value wins
    assert list(cfg.lvm_storages) == ["ok"]
    joined = "\n".join(cfg.warnings)
    assert "f.cfg line 1: ignored line outside a section" in joined
    assert "illegal characters" in joined
    assert "duplicate option 'chunksize'" in joined
    assert "duplicate storage ID 'ok'" in joined


@pytest.mark.parametrize(("option", "value", "reason"), [
    ("chunk-percentage", "1.5", "must be between 0 and 1"),
    ("chunk-percentage", "0", "must be between 0 and 1"),
    ("chunk-percentage", "1", "must be between 0 and 1"),
    ("chunk-percentage", "nan", "not a number"),
    ("chunk-percentage", "half", "not a number"),
    ("chunk-percentage", "-0.5", "must be between 0 and 1"),
    ("chunksize", "1g", "not a size"),
    ("chunksize", "0", "must be at least 1 MiB"),
    ("chunksize", "1000", "must be at least 1 MiB"),
    ("initial-size", "0", "must be at least 1 B"),
    ("initial-size", "big", "not a size"),
    ("shared", "maybe", "not a boolean"),
    ("vgname", "-vg", "not a valid volume group name"),
])
def test_invalid_values_name_storage_option_and_value(option: str, value: str,
                                                      reason: str) -> None:
    options = {"vgname": "vg", "chunksize": "1G", option: value}
    body = "".join(f"\t{k} {v}\n" for k, v in options.items())
    with pytest.raises(StorageOptionError) as caught:
        parse_storage_config(f"lvm: san1\n{body}", "/etc/pve/storage.cfg")
    err = caught.value
    assert isinstance(err, ConfigError)
    assert f"storage 'san1': {option} = {value}: {reason}" in str(err)
    line = 2 + list(options).index(option)
    assert str(err).startswith(f"/etc/pve/storage.cfg line {line}: ")
    [problem] = err.problems
    assert (problem.storeid, problem.option, problem.value) == ("san1", option, value)


def test_every_problem_is_reported_at_once() -> None:
    text = ("lvm: a0\n\tvgname va\n\tchunksize 1x\n\tchunk-percentage 2\n\n"
            "lvm: b0\n\tchunksize 1G\n")
    with pytest.raises(StorageOptionError) as caught:
        parse_storage_config(text, "t")
    assert [(p.storeid, p.option) for p in caught.value.problems] == [
        ("a0", "chunksize"), ("a0", "chunk-percentage"), ("b0", "vgname")]
    assert "storage 'b0': vgname = (no value): missing" in str(caught.value)


def test_our_options_are_checked_even_without_chunksize() -> None:
    # A storage that sets chunk-percentage but forgot chunksize is not thin,
    # but a bad value is still an error and the omission is warned about.
    with pytest.raises(StorageOptionError, match="chunk-percentage = 7"):
        parse_storage_config("lvm: a0\n\tvgname va\n\tchunk-percentage 7\n", "t")
    cfg = parse_storage_config("lvm: a0\n\tvgname va\n\tinitial-size 4G\n", "t")
    assert cfg.get("a0") is None
    assert "sets initial-size but no chunksize" in cfg.warnings[0]


def test_thick_lvm_without_vgname_is_skipped_like_proxmox() -> None:
    cfg = parse_storage_config("lvm: a0\n\tcontent images\n", "t")
    assert dict(cfg.lvm_storages) == {}
    assert "vgname missing" in cfg.warnings[0]


def test_by_vg_with_nodes() -> None:
    text = ("lvm: n1\n\tvgname pve\n\tnodes node1\n\tchunksize 1G\n\n"
            "lvm: n2\n\tvgname pve\n\tnodes node2,node3\n\tchunksize 2G\n")
    cfg = parse_storage_config(text, "t")
    n2 = cfg.by_vg("pve", node="node3")
    assert n2 is not None and n2.storeid == "n2"
    n1 = cfg.by_vg("pve", node="node1")
    assert n1 is not None and n1.storeid == "n1"
    assert cfg.by_vg("pve", node="node4") is None
    with pytest.raises(ConfigError, match="'n1' and 'n2' both use volume group 'pve'"):
        cfg.by_vg("pve")


def test_by_vg_same_settings_is_fine() -> None:
    text = ("lvm: a0\n\tvgname vg\n\tchunksize 1G\n\n"
            "lvm: b0\n\tvgname vg\n\tchunksize 1024M\n\tdisable\n")
    cfg = parse_storage_config(text, "t")
    found = cfg.by_vg("vg")
    assert found is not None and found.storeid == "a0"
    assert cfg.lvm_storages["b0"].disabled


def test_load_from_file(tmp_path: Path) -> None:
    path = tmp_path / "storage.cfg"
    path.write_text(REAL)
    cfg = load_storage_config(path)
    assert cfg.source == str(path) and "san1" in cfg.thin_storages
    with pytest.raises(ConfigError, match="cannot read storage configuration"):
        load_storage_config(tmp_path / "missing.cfg")
    path.write_bytes(b"lvm: a0\n\tvgname \xff\n")
    with pytest.raises(ConfigError, match="cannot read"):
        load_storage_config(path)


def test_daemon_settings_defaults_and_validation() -> None:
    settings = DaemonSettings()
    assert settings.poll_interval == 2.0 and settings.reconcile_interval == 30.0
    assert str(settings.run_dir) == "/var/run/qemu-server"
    assert str(settings.queue) == "/etc/pve/extend-queue"
    assert settings.lock_dir is None
    assert settings.inotify and not settings.global_worker
    assert settings.node and "." not in settings.node
    with pytest.raises(ConfigError, match="poll-interval = 0"):
        dataclasses.replace(settings, poll_interval=0)
    with pytest.raises(ConfigError, match="qmp-timeout = inf"):
        DaemonSettings(qmp_timeout=float("inf"))
    with pytest.raises(ConfigError, match="node name is empty"):
        DaemonSettings(node="")


def test_the_shipped_example_is_a_thin_pvestord_storage_and_a_thick_one() -> None:
    """packaging/storage.cfg.example, which the package ships as the way to
    set up a storage, parses without a warning: one thin, one left alone."""
    example = Path(__file__).resolve().parents[2] / "packaging" / "storage.cfg.example"
    config = parse_storage_config(example.read_text(), str(example))
    assert config.warnings == ()
    assert sorted(config.thin_storages) == ["san-thin"]
    thin = config.thin_storages["san-thin"]
    assert (thin.vgname, thin.chunksize, thin.initial_size) == ("vg_san", GiB, 2 * GiB)
