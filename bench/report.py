"""Percentiles, target checks, the printed table and the JSON report of ``bench.run``.

Pure: no LVM, no QEMU, so the unit tests check it on synthetic numbers
(tests/unit/test_bench_report.py) and a broken report builder shows up in
``make check`` without booting a guest.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

_COMPARE: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt}


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0..100), linear between the two nearest ranks.

    :raise ValueError: no values, or ``p`` outside 0..100.
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p} is outside 0..100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = math.floor(rank)
    high = math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary(values: Sequence[float]) -> dict[str, float]:
    """n, min, p50, p90, p99, max and mean of ``values`` (empty: only n=0)."""
    if not values:
        return {"n": 0}
    return {"n": len(values), "min": min(values), "p50": percentile(values, 50),
            "p90": percentile(values, 90), "p99": percentile(values, 99),
            "max": max(values), "mean": sum(values) / len(values)}


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``; None when either is unknown or the denominator is 0."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


@dataclass(frozen=True)
class Figure:
    """One row of the table: a measured figure against its target, if it has one."""

    scenario: str
    name: str
    value: float | None
    unit: str = ""
    #: ``("<=", 1.15)``; None for a figure reported without a target.
    target: tuple[str, float] | None = None
    note: str = ""
    #: Measured, but with no value to show, and the target known to be missed
    #: (no setting without failed writes, say); ``note`` says why.
    missed_without_value: bool = False

    @property
    def status(self) -> str:
        """``met``, ``missed``, ``-`` (no target) or ``not measured``."""
        if self.value is None:
            return "missed" if self.missed_without_value else "not measured"
        if self.target is None:
            return "-"
        op, limit = self.target
        return "met" if _COMPARE[op](self.value, limit) else "missed"

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["target"] = f"{self.target[0]} {self.target[1]:g}" if self.target else None
        data["status"] = self.status
        return data


def format_value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    text = f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return f"{text} {unit}".rstrip()


def table(figures: Sequence[Figure]) -> str:
    """The human summary: one line per figure, aligned columns."""
    header = ("SCENARIO", "FIGURE", "VALUE", "TARGET", "STATUS")
    rows = [(f.scenario, f.name, format_value(f.value, f.unit),
             f"{f.target[0]} {f.target[1]:g}" if f.target else "-", f.status)
            for f in figures]
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in (header, *rows)]
    notes = [f"  {f.scenario}/{f.name}: {f.note}" for f in figures if f.note]
    return "\n".join(lines + (["notes:", *notes] if notes else []))


def build_report(*, quick: bool, scenarios: Mapping[str, Any], figures: Sequence[Figure],
                 not_done: Mapping[str, str], environment: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON report: every scenario's raw figures, the table's rows, what was not done."""
    return {
        "bench": "pvestord",
        "quick": quick,
        "environment": dict(environment),
        "figures": [f.as_dict() for f in figures],
        "targets": {"met": sum(f.status == "met" for f in figures),
                    "missed": sum(f.status == "missed" for f in figures)},
        "not_done": dict(not_done),
        "scenarios": dict(scenarios),
    }
