"""The rules of ``pvestord check``: levels, advice, exit status, metadata arithmetic."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pvestord.policy import lvmetadata, preflight
from pvestord.policy.preflight import Finding, Level, Owner, UnitState, VgMetadata
from pvestord.policy.sizes import GiB, MiB, TiB

levels = st.sampled_from(list(Level))
findings = st.builds(lambda level, n: Finding("x", level, f"thing {n}", "do this"),
                     levels, st.integers(0, 99))


@given(st.lists(findings, max_size=20))
def test_exit_status_is_1_on_a_failure_2_on_warnings_only_else_0(found: list[Finding]) -> None:
    got = preflight.exit_status(found)
    if any(f.level is Level.FAIL for f in found):
        assert got == 1
    elif any(f.level is Level.WARN for f in found):
        assert got == 2
    else:
        assert got == 0


@given(st.lists(findings, max_size=20), findings)
def test_one_more_finding_never_improves_the_status(found: list[Finding], more: Finding) -> None:
    rank = {0: 0, 2: 1, 1: 2}
    assert rank[preflight.exit_status([*found, more])] >= rank[preflight.exit_status(found)]


@given(st.lists(findings, max_size=20))
def test_the_summary_counts_every_finding(found: list[Finding]) -> None:
    line = preflight.summary(found)
    assert line.startswith(f"SUMMARY: {len(found)} checks: ")
    for level in Level:
        assert f"{level.name} {sum(f.level is level for f in found)}" in line


@pytest.mark.parametrize("level", [Level.WARN, Level.FAIL, Level.SKIP])
def test_a_finding_that_is_not_a_pass_must_say_what_to_do(level: Level) -> None:
    with pytest.raises(ValueError, match="must say what to do"):
        Finding("x", level, "broken", " ")


def test_a_line_reads_as_pve8to9s() -> None:
    assert Finding("x", Level.FAIL, "broken", "fix it").line() == "FAIL: broken — fix it"
    assert Finding("x", Level.PASS, "fine").line() == "PASS: fine"


# -- the plugin in each daemon


def active(since: float | None) -> UnitState:
    return UnitState("pvedaemon.service", "loaded", "active", since)


@given(since=st.floats(0, 2e9), installed=st.floats(0, 2e9))
def test_a_daemon_fails_exactly_when_it_runs_since_before_the_plugin(
        since: float, installed: float) -> None:
    found = preflight.plugin_loaded("pvedaemon", active(since), installed)
    assert found.level is (Level.FAIL if since < math.floor(installed) else Level.PASS)
    if found.level is Level.FAIL:
        assert "systemctl reload-or-restart pvedaemon" in found.todo


@pytest.mark.parametrize(("state", "level"), [
    (None, Level.SKIP),
    (UnitState("pvedaemon.service", "not-found", "inactive"), Level.SKIP),
    (UnitState("pvedaemon.service", "loaded", "failed"), Level.SKIP),
    (active(None), Level.WARN),
])
def test_a_daemon_not_there_or_not_running_is_no_failure(
        state: UnitState | None, level: Level) -> None:
    assert preflight.plugin_loaded("pvedaemon", state, 100.0).level is level


def test_systemds_whole_seconds_count_a_reload_in_the_install_second_as_after_it() -> None:
    assert preflight.plugin_loaded("pvedaemon", active(1000.0), 1000.9).level is Level.PASS
    assert preflight.plugin_loaded("pvedaemon", active(999.0), 1000.0).level is Level.FAIL


def test_a_missing_plugin_file_fails() -> None:
    assert preflight.plugin_file("/p.pm", None).level is Level.FAIL
    assert preflight.plugin_file("/p.pm", 1.0).level is Level.PASS


# -- the event socket


@pytest.mark.parametrize(("owner", "level"), [
    (Owner.QMEVENTD_PY, Level.PASS), (Owner.QMEVENTD, Level.WARN),
    (Owner.OTHER, Level.WARN), (Owner.NOBODY, Level.FAIL), (Owner.UNKNOWN, Level.SKIP)])
def test_who_listens_on_the_socket(owner: Owner, level: Level) -> None:
    found = preflight.socket_owner("/run/qmeventd.sock", owner)
    assert found.level is level
    if level in (Level.WARN, Level.FAIL):
        assert "qmeventd-py" in found.todo


@pytest.mark.parametrize(("state", "level"), [
    (UnitState("qmeventd.service", "masked", "inactive", enablement="masked"), Level.PASS),
    (UnitState("qmeventd.service", "not-found", "inactive"), Level.PASS),
    (UnitState("qmeventd.service", "loaded", "inactive", enablement="enabled"), Level.WARN),
    (None, Level.SKIP)])
def test_qmeventd_must_be_masked(state: UnitState | None, level: Level) -> None:
    assert preflight.qmeventd_masked(state).level is level


# -- the LVM profile

SHIPPED = """# comment
report {
\toutput_format = "json"
}

log {
\treport_command_log = 1
\tcommand_log_selection = "all"   # every message
}
"""


def test_the_shipped_profile_passes_and_an_edited_one_warns() -> None:
    assert preflight.lvm_profile("/etc/lvm/profile/pvestord.profile", SHIPPED).level is Level.PASS
    edited = SHIPPED.replace("report_command_log = 1", "report_command_log = 0")
    found = preflight.lvm_profile("p", edited)
    assert found.level is Level.WARN and "log/report_command_log" in found.what
    assert preflight.lvm_profile("p", None).level is Level.WARN


@given(st.text(max_size=300))
def test_any_text_reads_as_a_profile_without_error(text: str) -> None:
    assert set(preflight.missing_profile_settings(text)) <= {
        f"{s}/{k}" for s, k, _ in preflight.PROFILE_SETTINGS}


# -- metadata against the extensions

#: Debian's default area: what vgs reported for a fresh VG.
DEFAULT_AREA = 1_044_480


def test_figures_for_the_areas_in_the_docs() -> None:
    # A 10 TiB VG in 1 GiB chunks: 10240 segments, more than ~4000 of the default area.
    meta = VgMetadata("san1", DEFAULT_AREA, DEFAULT_AREA // 2, 10 * TiB, GiB)
    found = preflight.lvm_metadata(meta)
    assert found.level is Level.WARN
    assert "about 4080 segments" in found.what and "up to 10240" in found.what
    assert "--metadatasize 128m" in found.todo
    # oVirt's 128 MiB area: half a million.
    big = VgMetadata("san1", 128 * MiB, 64 * MiB, 10 * TiB, GiB)
    assert preflight.lvm_metadata(big).level is Level.PASS
    # Told to expect fewer extensions, the default area is enough.
    assert preflight.lvm_metadata(meta, extensions=1000).level is Level.PASS


@given(size=st.integers(1, 1 << 30), free=st.integers(0, 1 << 30),
       vg=st.integers(0, 1 << 50), chunk=st.integers(MiB, 64 * GiB))
def test_metadata_fails_when_low_else_warns_when_too_small_for_the_vg(
        size: int, free: int, vg: int, chunk: int) -> None:
    meta = VgMetadata("vg", size, free, vg, chunk)
    found = preflight.lvm_metadata(meta)
    if lvmetadata.metadata_low(free, size):
        assert found.level is Level.FAIL
    elif lvmetadata.segments_room(size) < lvmetadata.segments_possible(vg, chunk):
        assert found.level is Level.WARN
    else:
        assert found.level is Level.PASS


@given(vg=st.integers(0, 1 << 50), chunk=st.integers(1, 1 << 40))
def test_segments_possible_covers_the_vg_in_chunks(vg: int, chunk: int) -> None:
    n = lvmetadata.segments_possible(vg, chunk)
    assert n * chunk >= vg
    assert max(0, n - 1) * chunk < vg or n == 0


@given(vg=st.integers(1, 1 << 50), chunk=st.integers(MiB, 1 << 40), more=st.integers(0, 1 << 40))
def test_a_smaller_chunk_never_needs_fewer_segments(vg: int, chunk: int, more: int) -> None:
    assert (lvmetadata.segments_possible(vg, chunk)
            >= lvmetadata.segments_possible(vg, chunk + more))


def test_a_vg_without_a_metadata_area_fails() -> None:
    assert preflight.lvm_metadata(VgMetadata("vg", 0, 0, GiB, GiB)).level is Level.FAIL


# -- the rest


def test_queue_lock_and_metrics_levels() -> None:
    assert preflight.queue("/q", "unreadable", 0, 0).level is Level.FAIL
    assert preflight.queue("/q", None, 3, 1).level is Level.WARN
    assert preflight.queue("/q", None, 3, 0).level is Level.PASS
    assert preflight.lock("file-q", "timed out").level is Level.FAIL
    assert preflight.metrics("/m", exists=False, writable=False).level is Level.SKIP
    assert preflight.metrics("/m", exists=True, writable=False).level is Level.FAIL
    assert preflight.metrics("/m", exists=True, writable=True).level is Level.PASS
