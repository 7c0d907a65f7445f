"""Which daemon events become Proxmox notifications (pvestord.policy.notices).

A condition the daemon sees on every pass (a VM paused, a VG low on space)
must give one notification per occurrence: when it starts, or gets worse,
never again while it lasts, and again once it ended and came back.
"""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from pvestord.policy import notices
from pvestord.policy.notices import (
    Announcements,
    LowSpace,
    Severity,
    StorageVanished,
    VgMarked,
    VmPaused,
    key_of,
    notice_for,
)

TEMPLATES = Path(__file__).resolve().parents[2] / "packaging" / "notification-templates"

EVENTS: list[notices.Event] = [
    LowSpace("vg1", "warn", "9 GiB", "100 GiB", "10%"),
    LowSpace("vg1", "critical", "4 GiB", "100 GiB", "5%"),
    VmPaused(101, ("drive-scsi0",)),
    VgMarked("vg1", "VM 101: pass abandoned after 300 s", "/run/pvestord/vg-unhealthy/vg1"),
    StorageVanished("thin1", "/etc/pve/storage.cfg", "2026-12-06 21:00:00",
                    "pvestord storage restore thin1 --apply"),
]

#: One pass's view of one condition: absent, or present as one of its events.
conditions = st.sampled_from([None, *EVENTS[2:]])


@given(st.lists(st.lists(conditions, min_size=1, max_size=4), max_size=30))
def test_one_notification_per_occurrence_however_many_passes(
        passes: list[list[notices.Event | None]]) -> None:
    """Each pass says every condition it sees; what it no longer sees has ended."""
    gate = Announcements("n1")
    active: set[notices.Key] = set()
    sent = started = 0
    for seen in passes:
        now = {key_of(e): e for e in seen if e is not None}
        for key in active - set(now):
            gate.over(key)
        started += len(set(now) - active)
        sent += sum(gate.seen(e) is not None for e in now.values())
        # The same pass seen again (a second round) says nothing new.
        assert all(gate.seen(e) is None for e in now.values())
        active = set(now)
    assert sent == started


@given(st.lists(st.sampled_from(["ok", "warn", "critical"]), max_size=40))
def test_low_space_is_told_per_crossing_not_per_pass(levels: list[str]) -> None:
    """Told when the level gets worse than the last reading, like the journal's
    warning (pvestord.policy.capacity.warn_now)."""
    rank = {"ok": 0, "warn": 1, "critical": 2}
    gate, previous, sent, crossings = Announcements("n1"), "ok", 0, 0
    key = notices.low_space_key("vg1")
    for level in levels:
        crossings += rank[level] > rank[previous]
        if level == "ok":
            gate.over(key)
        else:
            gate.lowered(key, rank[level])
            sent += gate.seen(LowSpace("vg1", level, "1 GiB", "100 GiB", "10%")) is not None
        previous = level
    assert sent == crossings


def test_another_vg_or_vm_is_another_occurrence() -> None:
    gate = Announcements("n1")
    assert gate.seen(VmPaused(101, ())) is not None
    assert gate.seen(VmPaused(102, ())) is not None
    assert gate.seen(VgMarked("vg1", "r", "m")) is not None
    assert gate.seen(LowSpace("vg1", "warn", "1", "2", "3")) is not None  # not the mark's


def test_severities_and_matcher_fields() -> None:
    found = {(n.template, n.severity, n.fields.get("event"))
             for n in (notice_for(e, "n1") for e in EVENTS)}
    assert found == {
        ("pvestord-low-space", Severity.WARNING, "low-space"),
        ("pvestord-low-space", Severity.ERROR, "low-space"),
        ("pvestord-vm-paused", Severity.WARNING, "vm-paused"),
        ("pvestord-vg-unhealthy", Severity.ERROR, "vg-unhealthy"),
        ("pvestord-storage-vanished", Severity.ERROR, "storage-vanished"),
    }
    for event in EVENTS:
        fields = notice_for(event, "n1").fields
        assert fields["type"] == "pvestord" and fields["hostname"] == "n1"
    assert notice_for(EVENTS[2], "n1").fields["vmid"] == "101"
    assert notice_for(EVENTS[4], "n1").fields["storage"] == "thin1"


def placeholders(text: str) -> set[str]:
    """The names a handlebars template prints ({{name}}; no helpers, no blocks)."""
    names = set()
    for inside in re.findall(r"{{(.*?)}}", text):
        assert not inside.strip().startswith(("#", "/", "!")), inside  # kept plain on purpose
        names.add(inside.strip())
    return names


def test_every_shipped_template_gets_the_fields_it_prints() -> None:
    """PVE::Notify renders a missing field as nothing: a message with holes."""
    for event in EVENTS:
        notice = notice_for(event, "n1")
        for part in ("subject", "body"):
            path = TEMPLATES / f"{notice.template}-{part}.txt.hbs"
            missing = placeholders(path.read_text()) - set(notice.data)
            assert not missing, (path.name, missing)
    shipped = {p.name.rsplit("-", 1)[0] for p in TEMPLATES.glob("*-subject.txt.hbs")}
    assert shipped == set(notices.TEMPLATES.values())


def test_the_package_installs_every_template_where_pve_notify_reads_them() -> None:
    """/usr/share/pve-manager/templates/default: where PVE::Notify looks for a
    template name after the admin's overrides in /etc/pve/notification-templates."""
    root = TEMPLATES.parents[1]
    lines = (root / "packaging" / "debian" / "pvestord.install").read_text().splitlines()
    installed = {src: dest for src, dest in (line.split() for line in lines if line.strip())}
    for path in TEMPLATES.glob("*.hbs"):
        source = path.relative_to(root).as_posix()
        assert installed.get(source) == "usr/share/pve-manager/templates/default/", source
    assert installed.get("packaging/notify/notify.pl") == "usr/share/pvestord/"
