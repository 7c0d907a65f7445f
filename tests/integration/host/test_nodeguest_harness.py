"""The node-guest harness reports failure and never hangs.

Each test boots a real guest (~15-30 s under TCG): a failing command inside
must fail on the host, and a guest that overruns its budget is killed and
reported with its console's last lines.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness import nodeguest


def test_guest_exit_status_reaches_the_host(tmp_path: Path) -> None:
    status = nodeguest.main(["--out", str(tmp_path), "--exec", "sh", "-c", "exit 7"])
    assert status == 7
    assert "booted" in (tmp_path / "inguest.started").read_text()


def test_guest_that_overruns_is_killed_with_console_tail(tmp_path: Path) -> None:
    with pytest.raises(nodeguest.GuestError, match="did not finish within 5 s") as info:
        nodeguest.run_guest(["exec", "sleep", "600"], tmp_path, timeout=5, echo=False)
    assert "Last console lines" in str(info.value)


def test_junit_counts_reads_pytest_reports(tmp_path: Path) -> None:
    report = tmp_path / "junit.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest" errors="1" failures="2" skipped="3" tests="10">'
        "</testsuite></testsuites>")
    counts = nodeguest.junit_counts(report)
    assert (counts.passed, counts.failures, counts.errors, counts.skipped) == (4, 2, 1, 3)
