"""Per-test budgets of the tiers whose tests outlast the default ``timeout``.

pyproject.toml gives every test 300 s (pytest-timeout), which covers the unit
and host tiers many times over. The tiers below boot guests or build Debian
roots inside their fixtures, and a fixture's time counts against the test
that first needs it, so they get budgets of their own, each well above the
slowest test seen there. A ``@pytest.mark.timeout(...)`` on a test still wins.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Hypothesis judges examples by the wall clock: its 200 ms deadline and its
# "input generation is slow" health check fail a correct test on a loaded or
# slow machine (seen here at a load average of 18, and CI machines differ by
# 2.5x). What a property asserts never depends on speed, so neither applies.
settings.register_profile("pvestord", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("pvestord")

#: Budget in seconds by path under ``tests/``; the longest matching prefix wins.
TIER_TIMEOUTS = {
    # A node guest boots in 15-30 s on an idle machine, minutes on a busy one.
    "integration/host/test_nodeguest_harness.py": 900.0,
    # Inside the node guest (TCG): the slowest tests take 2-3 minutes on an
    # idle machine, with waits of up to 300 s each for a guest to pause or a
    # daemon to start; on a loaded machine the simplest one took 105 s.
    "integration/node": 1200.0,
    # The first test boots both guests (up to 300 s) and starts four daemons;
    # one migration scenario alone has taken 3.5 minutes.
    "integration/cluster": 2400.0,
    # A first run makes the Debian roots with debootstrap and apt (minutes,
    # network-bound), then builds and boots a systemd image.
    "packaging": 3600.0,
}

_TESTS = Path(__file__).resolve().parent


def tier_timeout(path: Path) -> float | None:
    """The budget of the tier ``path`` belongs to, or None for the default."""
    try:
        relative = path.resolve().relative_to(_TESTS).as_posix()
    except ValueError:
        return None
    matches = [prefix for prefix in TIER_TIMEOUTS
               if relative == prefix or relative.startswith(prefix.rstrip("/") + "/")]
    return TIER_TIMEOUTS[max(matches, key=len)] if matches else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        budget = tier_timeout(item.path)
        if budget is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(budget))
