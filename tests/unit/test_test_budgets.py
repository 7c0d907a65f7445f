"""Every test has a time budget: a hung test fails instead of hanging CI.

pytest-timeout applies ``timeout`` from pyproject.toml; tests/conftest.py
raises it for the tiers that boot guests or build Debian roots.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import tier_timeout

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("path", "budget"), [
    ("tests/unit/test_policy.py", None),
    ("tests/integration/host/test_qmeventd.py", None),
    ("tests/integration/host/test_nodeguest_harness.py", 900.0),
    ("tests/integration/node/test_engine.py", 1200.0),
    ("tests/integration/cluster/test_migration.py", 2400.0),
    ("tests/packaging/test_deb.py", 3600.0),
    ("bench/latency.py", None),
])
def test_tiers_get_their_budgets(path: str, budget: float | None) -> None:
    assert tier_timeout(REPO / path) == budget


def test_the_default_budget_applies_here(request: pytest.FixtureRequest) -> None:
    assert float(request.config.getini("timeout")) == 300.0


def test_a_hung_async_test_fails_when_its_budget_runs_out(tmp_path: Path) -> None:
    test = tmp_path / "test_hung.py"
    test.write_text(textwrap.dedent("""\
        import asyncio

        async def test_hung() -> None:
            await asyncio.sleep(3600)
        """))
    done = subprocess.run(  # noqa: S603 - argument list
        [sys.executable, "-m", "pytest", "-c", str(REPO / "pyproject.toml"),
         "--rootdir", str(tmp_path), "-o", "timeout=2", "-q", str(test)],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed" in done.stdout
    assert "Timeout" in done.stdout
