"""Fuzzing the storage.cfg parser: hostile text, and generated valid configurations.

Whatever ``storage.cfg`` holds, only :class:`StorageOptionError` (a
:class:`ConfigError`) escapes, naming the storage and the option; a valid
configuration, however it is laid out, yields exactly the thin settings written.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from pvestord.adapters.config import StorageOptionError, parse_storage_config
from pvestord.errors import ConfigError
from pvestord.policy.storageoptions import (
    DEFAULT_CHUNK_PERCENTAGE,
    DEFAULT_INITIAL_SIZE,
    MIN_CHUNKSIZE,
    THIN_OPTIONS,
)

fuzz = settings(max_examples=200, deadline=None)

#: The options of ours whose values are checked (and so can be a problem).
CHECKED = {"vgname", "shared", "disable", *THIN_OPTIONS}
UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}

# -- hostile text

section_types = st.sampled_from(["lvm", "LVM", "Lvm", "dir", "lvmthin", "pbs", "", "lvm lvm"])
storage_ids = st.one_of(
    st.from_regex(r"[a-z][a-z0-9_.-]{0,10}[a-z0-9]", fullmatch=True),
    st.sampled_from(["a", "-x", "../etc", "san 1", "san1:", "\u017fan", "K1", "s" * 3000]),
    st.text(max_size=12),
)
option_keys = st.one_of(st.sampled_from(sorted(CHECKED | {"content", "nodes", "path"})),
                        st.text(max_size=10))
option_values = st.one_of(
    st.sampled_from(["", "1G", "1.5G", "0", "512", "1M", "1g", "1 G", "-1G", "1e3", "nan",
                     "inf", "0.5", "1.0", "0", "1", ".5", "5.", "1_0", "\u0661G", "\u0660.\u0665",
                     "9" * 5000, "9" * 5000 + "G", "0." + "0" * 400 + "1", "1e-400",
                     "1e400", "yes", "on", "TRUE", "2", "vg_san1", "vg san", "-vg", "\x00"]),
    st.text(max_size=20),
)
indents = st.sampled_from(["\t", " ", "  \t", "", "\x0b", "\u3000"])


@st.composite
def hostile_lines(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["header", "option", "option", "option", "blank", "junk"]))
    if kind == "header":
        sep = draw(st.sampled_from([": ", ":", ":\t", " : ", ": \t "]))
        return f"{draw(section_types)}{sep}{draw(storage_ids)}"
    if kind == "option":
        value = draw(st.none() | option_values)
        key = draw(option_keys)
        return f"{draw(indents)}{key}" + ("" if value is None else f" {value}")
    if kind == "blank":
        return draw(st.sampled_from(["", " ", "\t", "\r", "# comment", "  # lvm: x"]))
    return draw(st.text(max_size=40))


@st.composite
def hostile_sections(draw: st.DrawFn) -> str:
    """Mostly an ``lvm:`` header and our options, with hostile values and lines."""
    header = draw(st.sampled_from(["lvm: ", "LVM:\t"]) | section_types.map(lambda t: t + ": "))
    lines = [header + draw(storage_ids)]
    if draw(st.booleans()):  # a thin storage to start from, then the hostile lines
        lines += ["\tvgname vg_san1", "\tpvestord-chunksize 1G"]
    for _ in range(draw(st.integers(0, 8))):
        lines.append(draw(st.one_of(
            st.tuples(indents, option_keys, st.none() | option_values).map(
                lambda t: t[0] + t[1] + ("" if t[2] is None else f" {t[2]}")),
            st.tuples(st.sampled_from(sorted(CHECKED)), option_values).map(
                lambda kv: f"\t{kv[0]} {kv[1]}"),
            hostile_lines(),
        )))
    return "\n".join(lines)


hostile_texts = st.one_of(
    st.lists(hostile_sections(), max_size=4).map("\n\n".join),
    st.lists(hostile_lines(), max_size=25).map("\n".join),
    st.lists(hostile_lines(), max_size=25).map("\r\n".join),
    st.text(max_size=400),
)


@fuzz
@given(hostile_texts)
def test_only_storage_option_errors_escape_and_they_say_where(text: str) -> None:
    try:
        config = parse_storage_config(text, "storage.cfg")
    except StorageOptionError as err:
        assert isinstance(err, ConfigError)
        assert err.problems
        for problem in err.problems:
            assert problem.option in CHECKED
            assert problem.storeid in text
            assert 1 <= problem.line <= text.count("\n") + 1
            assert f"storage '{problem.storeid}': {problem.option} = " in str(err)
        return
    for sid, thin in config.thin_storages.items():
        assert sid in text and thin.storeid == sid
        assert thin.chunksize >= MIN_CHUNKSIZE and thin.initial_size >= 1
        assert 0 < thin.chunk_percentage < 1


# -- valid configurations, generated with the settings they must yield


@dataclass(frozen=True)
class Size:
    whole: int
    fraction: str
    unit: str

    @property
    def text(self) -> str:
        return f"{self.whole}{'.' + self.fraction if self.fraction else ''}{self.unit}"

    @property
    def bytes(self) -> int:
        # Proxmox truncates to whole bytes.
        scale: int = 10 ** len(self.fraction)
        return (self.whole * scale + int(self.fraction or 0)) * UNITS[self.unit] // scale


sizes = st.builds(Size, st.integers(0, 4096), st.sampled_from(["", "5", "25", "125", "0"]),
                  st.sampled_from(list(UNITS)))


@dataclass(frozen=True)
class Storage:
    storeid: str
    vgname: str
    chunksize: Size | None
    per_mille: int | None
    initial_size: Size | None
    shared: str | None
    others: tuple[tuple[str, str], ...]

    def lines(self, indent: str) -> list[str]:
        options = [("vgname", self.vgname), *self.others]
        if self.chunksize is not None:
            options.append(("pvestord-chunksize", self.chunksize.text))
        if self.per_mille is not None:
            options.append(("pvestord-chunk-percentage", f"0.{self.per_mille:03d}"))
        if self.initial_size is not None:
            options.append(("pvestord-initial-size", self.initial_size.text))
        if self.shared is not None:
            options.append(("shared", self.shared))
        return [f"lvm: {self.storeid}"] + [
            f"{indent}{key}" if value == "" else f"{indent}{key} {value}"
            for key, value in options]


storages = st.builds(
    Storage,
    storeid=st.from_regex(r"[a-z][a-z0-9_.-]{0,12}[a-z0-9]", fullmatch=True),
    # LVM's VG names: never "." or "..", which pve-storage's format lets through.
    vgname=st.from_regex(r"[a-zA-Z0-9.+_][a-zA-Z0-9.+_-]{0,20}", fullmatch=True)
    .filter(lambda name: name not in (".", "..")),
    chunksize=st.none() | sizes.filter(lambda s: s.bytes >= MIN_CHUNKSIZE),
    per_mille=st.none() | st.integers(1, 999),
    initial_size=st.none() | sizes.filter(lambda s: s.bytes >= 1),
    shared=st.none() | st.sampled_from(["", "0", "1", "yes", "off"]),
    others=st.lists(st.tuples(st.sampled_from(["content", "saferemove", "snapshot-as-volume-"
                                               "chain", "base"]),
                              st.from_regex(r"[a-z0-9,]{1,12}", fullmatch=True)),
                    max_size=3, unique_by=lambda kv: kv[0]).map(tuple),
)
OTHER_SECTIONS = ["dir: local\n\tpath /var/lib/vz\n\tcontent iso",
                  "lvmthin: local-lvm\n\tthinpool data\n\tvgname pve\n\tpvestord-chunksize 1"]


@fuzz
@given(st.lists(storages, max_size=5, unique_by=lambda s: s.storeid),
       st.sampled_from(["\t", " ", "    "]), st.sampled_from(["\n", "\r\n"]),
       st.booleans(), st.lists(st.sampled_from(OTHER_SECTIONS), max_size=2))
def test_valid_configurations_yield_the_settings_written(
        items: list[Storage], indent: str, newline: str, comments: bool,
        others: list[str]) -> None:
    blocks = others + ["\n".join(s.lines(indent)) for s in items]
    if comments:  # a comment line inside a section neither ends it nor counts
        blocks = [block.replace("\n", "\n# a comment\n", 1) for block in blocks]
    # Sections end at an empty line: a "\r" left by CRLF does not end one (nor
    # in Proxmox), so CRLF is used inside sections only.
    text = (newline + "\n").join(block.replace("\n", newline) for block in blocks)
    config = parse_storage_config(text, "storage.cfg")
    assert list(config.lvm_storages) == [s.storeid for s in items]
    expected = {s.storeid: s for s in items if s.chunksize is not None}
    assert set(config.thin_storages) == set(expected)
    for sid, thin in config.thin_storages.items():
        item = expected[sid]
        assert item.chunksize is not None
        assert thin.vgname == item.vgname
        assert thin.chunksize == item.chunksize.bytes
        assert thin.chunk_percentage == (DEFAULT_CHUNK_PERCENTAGE if item.per_mille is None
                                         else item.per_mille / 1000)
        assert thin.initial_size == (DEFAULT_INITIAL_SIZE if item.initial_size is None
                                     else item.initial_size.bytes)
        assert thin.shared == (item.shared in ("", "1", "yes"))
