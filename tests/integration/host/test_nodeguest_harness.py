"""The node-guest harness reports failure and never hangs.

Each test boots a real guest (~15-30 s under TCG): a failing command inside
must fail on the host, a guest that overruns its budget is killed and
reported with its console's last lines, and a guest that dies before it runs
the command is booted once more, showing the kernel's messages.

A guest given too little memory is a real early death: QEMU loads the kernel,
which stops before any init runs, as CI once saw a guest end after 5.4 s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.harness import nodeguest
from tests.harness.inguest import STARTED_MARKER


def test_guest_exit_status_reaches_the_host(tmp_path: Path) -> None:
    status = nodeguest.main(["--out", str(tmp_path), "--exec", "sh", "-c", "exit 7"])
    assert status == 7
    assert "booted" in (tmp_path / "inguest.started").read_text()


def test_guest_that_overruns_is_killed_with_console_tail(tmp_path: Path) -> None:
    with pytest.raises(nodeguest.GuestError, match="did not finish within 5 s") as info:
        nodeguest.run_guest(["exec", "sleep", "600"], tmp_path, timeout=5, echo=False)
    assert "Last console lines" in str(info.value)


#: Too little for Debian's kernel to reach init.
TOO_LITTLE_MEMORY = "64M"


def test_guest_that_dies_before_the_command_boots_again_then_fails_with_kernel_messages(
        tmp_path: Path) -> None:
    with pytest.raises(nodeguest.GuestError, match=f"{nodeguest.BOOT_ATTEMPTS} times") as info:
        nodeguest.run_guest(["exec", "true"], tmp_path, timeout=120, echo=False,
                            memory=TOO_LITTLE_MEMORY)
    assert not (tmp_path / STARTED_MARKER).exists()
    # The second boot showed the kernel's messages: its console has lines of its own.
    first, second = (tmp_path / "console.log").read_text().split("--- nodeguest: ", 1)
    assert second.strip().count("\n") > first.strip().count("\n")
    assert "--verbose" in str(info.value)


def test_guest_that_dies_once_runs_the_command_on_its_second_boot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_argv = nodeguest.vng_argv
    boots: list[str] = []

    def first_boot_starved(*args: Any, **kwargs: Any) -> list[str]:
        if not boots:
            kwargs["memory"] = TOO_LITTLE_MEMORY
        boots.append(kwargs["memory"])
        return real_argv(*args, **kwargs)

    monkeypatch.setattr(nodeguest, "vng_argv", first_boot_starved)
    result = nodeguest.run_guest(["exec", "sh", "-c", "exit 7"], tmp_path, timeout=300,
                                 echo=False)
    assert result.returncode == 7
    assert boots == [TOO_LITTLE_MEMORY, nodeguest.DEFAULT_MEMORY]


def test_junit_counts_reads_pytest_reports(tmp_path: Path) -> None:
    report = tmp_path / "junit.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest" errors="1" failures="2" skipped="3" tests="10">'
        "</testsuite></testsuites>")
    counts = nodeguest.junit_counts(report)
    assert (counts.passed, counts.failures, counts.errors, counts.skipped) == (4, 2, 1, 3)
