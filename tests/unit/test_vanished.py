"""The rules for ``pvestord:`` sections that vanish from storage.cfg.

A node without the plugin rewrites storage.cfg with only the sections it
knows; pvestord keeps a copy of its own sections, says which vanished, and
puts them back as they were. Generated configurations, laid out as Proxmox
writes them (a header, tab-indented options, a blank line between sections).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pvestord.adapters import keptsections
from pvestord.adapters.lockflock import FlockLock
from pvestord.adapters.storagecfg import parse_sections
from pvestord.features import restore
from pvestord.policy.vanished import (
    Kept,
    observe,
    restore_command,
    section_text,
    vanished_message,
    with_sections,
)

TYPES = ("pvestord", "lvm", "dir", "nfs", "zfspool", "pbs")
ids = st.from_regex(r"[a-z][a-z0-9_.-]{0,8}[a-z0-9]", fullmatch=True)
options = st.dictionaries(st.from_regex(r"[a-z][a-z-]{0,12}", fullmatch=True),
                          st.from_regex(r"[A-Za-z0-9_./,-]{1,12}", fullmatch=True),
                          max_size=5)


@st.composite
def configs(draw: st.DrawFn) -> list[tuple[str, str, str]]:
    """(type, id, the section's text as Proxmox writes it), ids unique."""
    sids = draw(st.lists(ids, unique=True, max_size=6))
    out = []
    for sid in sids:
        type_ = draw(st.sampled_from(TYPES))
        opts = draw(options)
        text = f"{type_}: {sid}\n" + "".join(f"\t{k} {v}\n" for k, v in opts.items())
        out.append((type_, sid, text))
    return out


def render(sections: list[tuple[str, str, str]]) -> str:
    return "\n".join(text for _, _, text in sections)


def reading(text: str) -> tuple[dict[str, str], frozenset[str]]:
    """What the daemon hands :func:`observe` for ``text``."""
    sections, _ = parse_sections(text, "storage.cfg")
    lines = text.split("\n")
    return ({s.id: section_text(lines, s.line) for s in sections if s.type == "pvestord"},
            frozenset(s.id for s in sections))


def parsed(text: str) -> set[tuple[str, str, tuple[tuple[str, str | None], ...]]]:
    sections, warnings = parse_sections(text, "storage.cfg")
    assert warnings == []
    return {(s.type, s.id, tuple(s.options.items())) for s in sections}


@given(configs())
def test_each_section_is_kept_verbatim(cfg: list[tuple[str, str, str]]) -> None:
    current, _ = reading(render(cfg))
    assert current == {sid: text for type_, sid, text in cfg if type_ == "pvestord"}


@given(configs(), st.data())
def test_what_vanished_is_exactly_what_the_rewrite_dropped_and_comes_back_whole(
        cfg: list[tuple[str, str, str]], data: st.DataObject) -> None:
    ours = [sid for type_, sid, _ in cfg if type_ == "pvestord"]
    dropped = set(data.draw(st.lists(st.sampled_from(ours), unique=True) if ours
                            else st.just([])))
    before = render(cfg)
    kept = observe({}, *reading(before), now=1.0).kept
    after = render([s for s in cfg if s[1] not in dropped])
    seen = observe(kept, *reading(after), now=2.0)
    assert set(seen.newly_vanished) == set(seen.vanished) == dropped
    assert {sid: k.text for sid, k in seen.vanished.items()} == {
        sid: text for _, sid, text in cfg if sid in dropped}
    assert all(k.seen == 1.0 and k.vanished == 2.0 for k in seen.vanished.values())
    # Read again without them: still gone, not "newly".
    again = observe(seen.kept, *reading(after), now=3.0)
    assert again.newly_vanished == () and set(again.vanished) == dropped
    assert all(k.vanished == 2.0 for k in again.vanished.values())
    # Appended back, the file holds every section it held, each as it was.
    restored = with_sections(after, [k.text for k in again.vanished.values()])
    assert parsed(restored) == parsed(before)
    back = observe(again.kept, *reading(restored), now=4.0)
    assert set(back.back) == dropped and back.vanished == {}


def test_an_id_kept_under_another_type_did_not_vanish() -> None:
    kept = observe({}, *reading("pvestord: san1\n\tvgname vg1\n"), now=1.0).kept
    seen = observe(kept, *reading("lvm: san1\n\tvgname vg1\n"), now=2.0)
    assert seen.vanished == {} and seen.newly_vanished == ()
    assert seen.kept == {}  # the file says what the admin wants now


@pytest.mark.parametrize("text", ["", "dir: local\n\tpath /var/lib/vz\n",
                                  "dir: local\n\tpath /var/lib/vz", "dir: local\n\n\n"])
def test_appended_after_a_blank_line_whatever_the_file_ends_with(text: str) -> None:
    section = "pvestord: san1\n\tvgname vg1\n"
    out = with_sections(text, [section])
    assert out.endswith(section)
    if text:
        assert "\n\n" + section in out  # a section never runs on into the last one
    else:
        assert out == section
    assert {s.id for s in parse_sections(out, "x")[0]} >= {"san1"}


def test_the_message_names_the_storage_the_command_and_the_exact_text() -> None:
    kept = Kept("san1", "pvestord: san1\n\tvgname vg1\n\tshared 1\n", 1.0, 2.0)
    message = vanished_message(kept, "/etc/pve/storage.cfg", "2026-12-06 20:00:00")
    assert "storage 'san1' vanished from /etc/pve/storage.cfg" in message
    assert restore_command("san1") in message
    assert repr(kept.text) in message and "\n" not in message


def test_the_copy_survives_a_round_trip_and_a_damaged_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state" / keptsections.FILE_NAME
    assert keptsections.read(path) == {}
    kept = {"san1": Kept("san1", "pvestord: san1\n\tvgname vg1\n", 1.5, None),
            "san2": Kept("san2", "pvestord: san2\n\tvgname vg2\n", 1.0, 3.0)}
    keptsections.write(path, kept)
    assert keptsections.read(path) == kept
    path.write_text(json.dumps({"sections": {"san1": {"text": 5, "seen": 1}}}))
    with pytest.raises(keptsections.KeptSectionsError, match="not a copy"):
        keptsections.read(path)


def test_restore_appends_the_copy_once_under_the_lock(tmp_path: Path) -> None:
    cfg = tmp_path / "storage.cfg"
    cfg.write_text("dir: local\n\tpath /var/lib/vz\n\tcontent iso\n")
    kept_file = tmp_path / keptsections.FILE_NAME
    section = "pvestord: san1\n\tvgname vg1\n\tpvestord-chunksize 1G\n"
    keptsections.write(kept_file, {"san1": Kept("san1", section, 1.0, 2.0)})
    lock = FlockLock(tmp_path / "storage.cfg.lock")
    shown = restore.restore(cfg, kept_file, "san1", apply=False, lock=lock)
    assert (shown.kept.text, shown.written) == (section, False)
    assert "san1" not in cfg.read_text()
    done = restore.restore(cfg, kept_file, "san1", apply=True, lock=lock)
    assert done.written
    assert cfg.read_text() == ("dir: local\n\tpath /var/lib/vz\n\tcontent iso\n\n" + section)
    with pytest.raises(restore.RestoreError, match="already"):
        restore.restore(cfg, kept_file, "san1", apply=True, lock=lock)
    with pytest.raises(restore.RestoreError, match="no copy of storage 'san9'"):
        restore.restore(cfg, kept_file, "san9", apply=True, lock=lock)
