"""storage.cfg parsing (as PVE::SectionConfig parses it) and our lvm options."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pvestord.adapters.config import StorageOptionError, load_storage_config, parse_storage_config
from pvestord.adapters.settings import DaemonSettings
from pvestord.errors import ConfigError
from pvestord.policy.sizes import GiB, MiB
from pvestord.policy.storageoptions import FORMER_NAMES, THIN_OPTIONS

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
\tpvestord-chunksize 256M
\tpvestord-chunk-percentage 0.25
\tpvestord-initial-size 1G

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
    cfg = parse_storage_config("lvm: s0\n\tvgname vg\n\tpvestord-chunksize 1G\n", "t")
    thin = cfg.get("s0")
    assert thin is not None
    assert (thin.chunksize, thin.chunk_percentage, thin.initial_size, thin.shared) == (
        GiB, 0.5, 2 * GiB, False)


def test_space_indentation_comments_crlf_and_case() -> None:
    text = ("# header comment\n"
            "PVESTORD:   s1  \r\n"  # the plugin type; lvm: + chunksize warns
            "    vgname   vg1\r\n"
            "  # a comment inside a section does not end it\n"
            "    pvestord-chunksize 512M   \r\n"
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
    cfg = parse_storage_config("lvm: a\n\tvgname va\n\tpvestord-chunksize 1G\n", "t")
    assert dict(cfg.lvm_storages) == {}
    assert "storage ID 'a' contains illegal characters" in cfg.warnings[0]


def test_file_without_trailing_newline_and_empty_file() -> None:
    cfg = parse_storage_config("lvm: s0\n\tvgname vg\n\tpvestord-chunksize 1G", "t")
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
            "lvm: bad!id\n\tvgname vg\n\tpvestord-chunksize 1G\n\n"
            "lvm: ok\n\tvgname vg\n\tpvestord-chunksize 1G\n\tpvestord-chunksize 2G\n\n"
            "lvm: ok\n\tvgname other\n")
    cfg = parse_storage_config(text, "f.cfg")
    ok = cfg.get("ok")
    assert ok is not None and ok.chunksize == GiB and ok.vgname == "vg"  # first value wins
    assert list(cfg.lvm_storages) == ["ok"]
    joined = "\n".join(cfg.warnings)
    assert "f.cfg line 1: ignored line outside a section" in joined
    assert "illegal characters" in joined
    assert "duplicate option 'pvestord-chunksize'" in joined
    assert "duplicate storage ID 'ok'" in joined


@pytest.mark.parametrize(("option", "value", "reason"), [
    ("pvestord-chunk-percentage", "1.5", "must be between 0 and 1"),
    ("pvestord-chunk-percentage", "0", "must be between 0 and 1"),
    ("pvestord-chunk-percentage", "1", "must be between 0 and 1"),
    ("pvestord-chunk-percentage", "nan", "not a number"),
    ("pvestord-chunk-percentage", "half", "not a number"),
    ("pvestord-chunk-percentage", "-0.5", "must be between 0 and 1"),
    ("pvestord-chunksize", "1g", "not a size"),
    ("pvestord-chunksize", "0", "must be at least 1 MiB"),
    ("pvestord-chunksize", "1000", "must be at least 1 MiB"),
    ("pvestord-initial-size", "0", "must be at least 1 B"),
    ("pvestord-initial-size", "big", "not a size"),
    ("shared", "maybe", "not a boolean"),
    ("vgname", "-vg", "not a valid volume group name"),
    ("vgname", "..", "not a valid volume group name"),
])
def test_invalid_values_name_storage_option_and_value(option: str, value: str,
                                                      reason: str) -> None:
    options = {"vgname": "vg", "pvestord-chunksize": "1G", option: value}
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
    text = ("lvm: a0\n\tvgname va\n\tpvestord-chunksize 1x\n\tpvestord-chunk-percentage 2\n\n"
            "lvm: b0\n\tpvestord-chunksize 1G\n")
    with pytest.raises(StorageOptionError) as caught:
        parse_storage_config(text, "t")
    assert [(p.storeid, p.option) for p in caught.value.problems] == [
        ("a0", "pvestord-chunksize"), ("a0", "pvestord-chunk-percentage"), ("b0", "vgname")]
    assert "storage 'b0': vgname = (no value): missing" in str(caught.value)


def test_our_options_are_checked_even_without_chunksize() -> None:
    # A storage that sets chunk-percentage but forgot chunksize is not thin,
    # but a bad value is still an error and the omission is warned about.
    with pytest.raises(StorageOptionError, match="pvestord-chunk-percentage = 7"):
        parse_storage_config("lvm: a0\n\tvgname va\n\tpvestord-chunk-percentage 7\n", "t")
    cfg = parse_storage_config("lvm: a0\n\tvgname va\n\tpvestord-initial-size 4G\n", "t")
    assert cfg.get("a0") is None
    assert "sets pvestord-initial-size but no pvestord-chunksize" in cfg.warnings[0]


def test_thick_lvm_without_vgname_is_skipped_like_proxmox() -> None:
    cfg = parse_storage_config("lvm: a0\n\tcontent images\n", "t")
    assert dict(cfg.lvm_storages) == {}
    assert "vgname missing" in cfg.warnings[0]


def test_by_vg_with_nodes() -> None:
    text = ("lvm: n1\n\tvgname pve\n\tnodes node1\n\tpvestord-chunksize 1G\n\n"
            "lvm: n2\n\tvgname pve\n\tnodes node2,node3\n\tpvestord-chunksize 2G\n")
    cfg = parse_storage_config(text, "t")
    n2 = cfg.by_vg("pve", node="node3")
    assert n2 is not None and n2.storeid == "n2"
    n1 = cfg.by_vg("pve", node="node1")
    assert n1 is not None and n1.storeid == "n1"
    assert cfg.by_vg("pve", node="node4") is None
    with pytest.raises(ConfigError, match="'n1' and 'n2' both use volume group 'pve'"):
        cfg.by_vg("pve")


def test_by_vg_same_settings_is_fine() -> None:
    text = ("lvm: a0\n\tvgname vg\n\tpvestord-chunksize 1G\n\n"
            "lvm: b0\n\tvgname vg\n\tpvestord-chunksize 1024M\n\tdisable\n")
    cfg = parse_storage_config(text, "t")
    found = cfg.by_vg("vg")
    assert found is not None and found.storeid == "a0"
    assert cfg.lvm_storages["b0"].disabled


def test_a_disabled_thin_storage_still_grows_the_disks_of_running_vms() -> None:
    # Proxmox stops new users of a disabled storage; a VM started before keeps
    # writing, and must not stay paused for want of room.
    cfg = parse_storage_config(
        "lvm: san1\n\tvgname vg\n\tpvestord-chunksize 1G\n\tdisable\n", "t")
    found = cfg.by_vg("vg", node="node1")
    assert found is not None and found.storeid == "san1"


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


# --- our options' former names ----------------------------------------------

#: A valid value of each option of ours, by its current name.
VALID_VALUES = {"pvestord-chunksize": ("256M", "1G", "3072K"),
                "pvestord-chunk-percentage": ("0.25", "0.5", ".9"),
                "pvestord-initial-size": ("512M", "2G", "1T"),
                "pvestord-thin-warn-free": ("20%", "50G"),
                "pvestord-thin-critical-free": ("8G", "5%"),
                "pvestord-max-overcommit": ("2.5", "3"),
                "pvestord-thin-reserve": ("0", "4G")}


def _thin_settings(text: str) -> tuple[object, ...]:
    thin = parse_storage_config(text, "t").thin_storages["s1"]
    return (thin.chunksize, thin.chunk_percentage, thin.initial_size, thin.guards)


def _section(lines: list[str]) -> str:
    return "pvestord: s1\n\tvgname vg\n" + "".join(f"\t{line}\n" for line in lines)


def test_former_names_are_the_current_ones_list_matches() -> None:
    assert sorted(FORMER_NAMES.values()) == sorted(VALID_VALUES) == sorted(THIN_OPTIONS)
    assert all(current == "pvestord-" + former for former, current in FORMER_NAMES.items())


@pytest.mark.parametrize("current", sorted(VALID_VALUES))
def test_a_former_name_reads_the_same_value_and_warns_once(current: str) -> None:
    former = current.removeprefix("pvestord-")
    value = VALID_VALUES[current][0]
    assert _thin_settings(_section([f"{former} {value}"])) == _thin_settings(
        _section([f"{current} {value}"])) != _thin_settings(_section([]))
    warnings = parse_storage_config(_section([f"{former} {value}"]), "t").warnings
    assert warnings == (f"t line 3: storage 's1': '{former}' is deprecated, read as"
                        f" '{current}': rename it in storage.cfg",)
    assert parse_storage_config(_section([f"{current} {value}"]), "t").warnings == ()


def test_the_prefixed_name_wins_over_the_former_one_even_unusable() -> None:
    text = _section(["chunksize 2G", "pvestord-chunksize 256M",
                     "chunk-percentage nonsense", "pvestord-chunk-percentage 0.25"])
    cfg = parse_storage_config(text, "t")
    thin = cfg.thin_storages["s1"]
    assert (thin.chunksize, thin.chunk_percentage) == (256 * MiB, 0.25)
    assert cfg.warnings == (
        "t line 3: storage 's1': 'chunksize' ignored: 'pvestord-chunksize' is set too"
        " (remove the 'chunksize' line)",
        "t line 5: storage 's1': 'chunk-percentage' ignored: 'pvestord-chunk-percentage'"
        " is set too (remove the 'chunk-percentage' line)")


def test_an_unusable_value_under_a_former_name_is_named_as_written() -> None:
    with pytest.raises(StorageOptionError) as caught:
        parse_storage_config(_section(["pvestord-initial-size 1G", "chunksize 1g"]), "t")
    [problem] = caught.value.problems
    assert (problem.option, problem.value, problem.line) == ("chunksize", "1g", 4)


def test_an_lvm_section_with_the_former_chunksize_is_still_thin() -> None:
    cfg = parse_storage_config("lvm: s1\n\tvgname vg\n\tchunksize 512M\n", "t")
    assert cfg.thin_storages["s1"].chunksize == 512 * MiB
    assert any("change the section header to 'pvestord: s1'" in w for w in cfg.warnings)
    assert any("'chunksize' is deprecated" in w for w in cfg.warnings)
    thick = parse_storage_config("lvm: s1\n\tvgname vg\n\tinitial-size 1G\n", "t")
    assert thick.thin_storages == {}
    assert thick.warnings == ("t line 1: storage 's1' sets initial-size but no"
                              " pvestord-chunksize: it is not thin-enabled",)


#: How one option is written: not at all, under one name, or under both.
_SPELLINGS = st.sampled_from(["absent", "current", "former", "both"])


@given(st.fixed_dictionaries({name: st.tuples(_SPELLINGS, st.sampled_from(values),
                                              st.sampled_from(values))
                              for name, values in VALID_VALUES.items()}))
def test_any_mix_of_names_reads_as_the_winning_names_alone(
        written: dict[str, tuple[str, str, str]]) -> None:
    """Whatever names a section uses, it sets what a section with only the
    prefixed names would: the prefixed value where it is written, else the
    former one."""
    mixed: list[str] = []
    expected: list[str] = []
    for current, (spelling, value, former_value) in written.items():
        former = current.removeprefix("pvestord-")
        if spelling in ("former", "both"):
            mixed.append(f"{former} {former_value}")
        if spelling in ("current", "both"):
            mixed.append(f"{current} {value}")
        if spelling != "absent":
            expected.append(f"{current} {former_value if spelling == 'former' else value}")
    assert _thin_settings(_section(mixed)) == _thin_settings(_section(expected))
    warned = parse_storage_config(_section(mixed), "t").warnings
    assert len(warned) == sum(s in ("former", "both") for s, _, _ in written.values())
