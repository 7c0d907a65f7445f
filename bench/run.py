"""``make bench``: every benchmark scenario of ``bench/``, ``pvestord placement``'s included.

Run by ``python -m tests.harness.nodeguest --out out/bench --bench [--quick]``,
which starts ``python -m bench.run --out DIR [--quick]`` inside the guest (real
device-mapper and LVM). Every figure that matters is a ratio of two things
measured side by side in this run: absolute times on an emulated node mean
little. Scenarios run in their numbered order; one that fails is reported as
not done, with its error, and the others still run. Scenarios 1 to 3
(latency, floor, original) run as one: set up together and sampled in turn
(bench.latency.side_by_side), so that a change of load hits them alike. Prints a table
(scenario, figure, target, met/missed) and writes ``DIR/bench.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import (
    blockjobs,
    fleet,
    jobahead,
    latency,
    livepause,
    lvm_shell,
    pausefree,
    placement,
    qmp_sessions,
)
from bench.report import Figure, build_report, ratio, table


@dataclass(frozen=True)
class Sizes:
    """How much each scenario measures."""

    extensions: int
    shell_rounds: int
    idle_seconds: float
    pause_free_total: int
    pause_free_percentages: tuple[float, ...]
    #: Timed runs of each ``pvestord placement`` case.
    placement_runs: int
    #: Extensions under the QMP proxy (scenario 8).
    qmp_extensions: int
    #: Rounds of scenarios 9 (both jobs on both sides each), 10 (a stream
    #: at each rate) and 11 (a reduction of each size), and the data each
    #: job of 9 and 10 copies.
    blockjob_rounds: int
    blockjob_data: int


MiB = 1024 * 1024
#: The idle window holds at least two reconciles (every 30 s) and one
#: reading of the VG accounts (every 60 s): its counts are per minute.
FULL = Sizes(extensions=30, shell_rounds=30, idle_seconds=120, pause_free_total=2048 * MiB,
             pause_free_percentages=(0.9, 0.7, 0.5, 0.3), placement_runs=3,
             qmp_extensions=50, blockjob_rounds=4, blockjob_data=1024 * MiB)
#: Each pause-free setting costs ~50 s in the node guest: two in quick mode.
QUICK = Sizes(extensions=10, shell_rounds=10, idle_seconds=65, pause_free_total=512 * MiB,
              pause_free_percentages=(0.9, 0.5), placement_runs=1, qmp_extensions=20,
              blockjob_rounds=2, blockjob_data=256 * MiB)


def _p50(result: dict[str, Any] | None, part: str = "total") -> float | None:
    if result is None:
        return None
    value = result["summary"].get(part, {}).get("p50")
    return None if value is None else float(value)


def figures_for(results: dict[str, Any]) -> list[Figure]:
    """The table's rows from the scenarios' raw results (absent scenario: not measured)."""
    ours = results.get("latency")
    floor = results.get("floor")
    naive_floor = results.get("naive_floor")
    original = results.get("original")
    shell = results.get("lvm_shell")
    rows: list[Figure] = []
    if ours is not None:
        total = ours["summary"]["total"]
        rows += [Figure("1 latency", f"event to re-armed p{p}", total.get(f"p{p}"), "s")
                 for p in (50, 90, 99)]
        rows += [Figure("1 latency", f"p50 {part}", _p50(ours, part), "s")
                 for part in ("queue_wait", "qmp", "lock_wait", "lvm", "other")]
        rows.append(Figure("1 latency", "extensions measured", float(total["n"])))
    rows.append(Figure("2 floor", "floor p50", _p50(floor), "s"))
    rows.append(Figure("2 floor", "daemon/floor p50", ratio(_p50(ours), _p50(floor)),
                       target=("<=", 1.15), note=_interleaved(ours, floor)))
    rows.append(Figure("3 original", "original p50", _p50(original), "s"))
    rows.append(Figure("3 original", "original/ours p50", ratio(_p50(original), _p50(ours)),
                       target=(">=", 1.5), note=_interleaved(ours, original)))
    # LVM's time swings with the load on the machine; this one leaves it out
    # (no target).
    rows.append(Figure("3 original", "original/ours p50 of total minus LVM",
                       ratio(_p50(original, "total_without_lvm"),
                             _p50(ours, "total_without_lvm"))))
    rows.append(Figure("4 lvm shell", "naive floor p50", _p50(naive_floor), "s"))
    rows.append(Figure("4 lvm shell", "ours/naive-floor p50",
                       ratio(_p50(ours), _p50(naive_floor)), target=("<=", 0.6),
                       note=_interleaved(ours, naive_floor)))
    rows.append(Figure("4 lvm shell", "shell/plain lvextend p50",
                       ratio(_p50(shell, "shell_lvextend"), _p50(shell, "plain_lvextend"))))
    rows.append(Figure("4 lvm shell", "shell/plain lvs+lvextend p50",
                       ratio(_p50(shell, "shell_lvs_lvextend"),
                             _p50(shell, "plain_lvs_lvextend"))))
    rows += _pause_free_figures(results.get("pause_free"), ours)
    rows += _fleet_figures(results.get("fleet"))
    rows += placement.figures(results.get("placement"))
    rows += qmp_sessions.figures(results.get("qmp_sessions"))
    rows += blockjobs.figures(results.get("blockjobs"))
    rows += jobahead.figures(results.get("jobahead"))
    rows += livepause.figures(results.get("livepause"))
    return rows


def _interleaved(*sides: dict[str, Any] | None) -> str:
    """The note of a ratio whose two sides were sampled in turn (empty if they were not)."""
    if all(side is not None and side.get("interleaved") for side in sides):
        return "both sides sampled in turn in one run (A B A B ...), set up at once"
    return ""


def _pause_free_figures(result: dict[str, Any] | None,
                        ours: dict[str, Any] | None) -> list[Figure]:
    rate = result["rate"] if result else None
    p99 = ours["summary"]["total"].get("p99") if ours else None
    needed = None if rate is None or p99 is None else rate * p99
    clean = result["smallest_clean_headroom"] if result else None
    rows = [Figure("5 pause-free", "writer rate", None if rate is None else rate / MiB, "MiB/s"),
            Figure("5 pause-free", "rate x p99 latency",
                   None if needed is None else needed / MiB, "MiB")]
    if result is not None and clean is None:
        tried = ", ".join(f"{s['headroom'] // MiB} MiB: {s['failed_writes']} failed"
                          for s in result["settings"])
        rows.append(Figure("5 pause-free", "zero-failure headroom / (rate x p99)", None,
                           target=("<=", 1.5), missed_without_value=True,
                           note=f"no setting without failed writes ({tried})"))
    else:
        rows += [Figure("5 pause-free", "smallest zero-failure headroom",
                        None if clean is None else clean / MiB, "MiB"),
                 Figure("5 pause-free", "zero-failure headroom / (rate x p99)",
                        ratio(clean, needed), target=("<=", 1.5))]
    return rows


def _fleet_figures(result: dict[str, Any] | None) -> list[Figure]:
    one = result["burst_one_vg"]["seconds"] if result else None
    two = result["burst_two_vgs"]["seconds"] if result else None
    # Not alternated: one burst costs one to two minutes in the node guest.
    rows = [Figure("6 burst", "16 drives, one VG", one, "s"),
            Figure("6 burst", "8+8 drives, two VGs", two, "s"),
            Figure("6 burst", "two-VG/one-VG", ratio(two, one), target=("<=", 0.6),
                   note="" if result is None else "one burst after the other, not alternated")]
    idle = result["idle"] if result else {}
    for daemon in ("pvestord", "qmeventd-py"):
        figures = idle.get(daemon, {})
        rss = figures.get("rss_bytes")
        rows += [
            Figure("7 idle", f"{daemon} CPU % of a core", figures.get("cpu_percent"), "%",
                   target=("<", 0.5)),
            Figure("7 idle", f"{daemon} CPU % with its LVM children",
                   figures.get("cpu_percent_with_children"), "%", target=("<", 0.5)),
            Figure("7 idle", f"{daemon} RSS", None if rss is None else rss / MiB, "MiB",
                   target=("<", 60))]
    counts = idle.get("counts", {})
    rows += [
        Figure("7 idle", "LVM processes per minute", counts.get("lvm_processes_per_minute"),
               target=("<=", 0)),
        Figure("7 idle", "QMP sessions per VM per minute",
               counts.get("qmp_sessions_per_vm_per_minute"), target=("<=", 2)),
        Figure("7 idle", "writes to pmxcfs per minute", counts.get("pmxcfs_writes_per_minute"),
               target=("<=", 6))]
    return rows


def environment(quick: bool) -> dict[str, Any]:
    return {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": platform.node(),
            "kernel": platform.release(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "quick": quick,
            "in_node_guest": os.environ.get("PVESTORD_IN_NODE_GUEST") == "1"}


#: What each scenario produces: results by name (scenarios 1-3 run as one).
Scenario = Callable[[], dict[str, dict[str, Any]]]
#: ``--only`` names that run a scenario under another name.
ALIASES = {"floor": "latency", "naive_floor": "latency", "original": "latency"}


def scenarios(out: Path, sizes: Sizes) -> list[tuple[str, Scenario]]:
    return [
        ("latency", lambda: latency.side_by_side(out, sizes.extensions)),
        ("lvm_shell", lambda: {"lvm_shell": lvm_shell.compare(sizes.shell_rounds)}),
        ("pause_free", lambda: {"pause_free": pausefree.run(
            out, sizes.pause_free_total, sizes.pause_free_percentages)}),
        ("fleet", lambda: {"fleet": fleet.run(out, sizes.idle_seconds)}),
        ("placement", lambda: {"placement": placement.run(sizes.placement_runs)}),
        ("qmp_sessions", lambda: {"qmp_sessions": qmp_sessions.run(out, sizes.qmp_extensions)}),
        ("blockjobs", lambda: {"blockjobs": blockjobs.run(
            sizes.blockjob_rounds, sizes.blockjob_data)}),
        ("jobahead", lambda: {"jobahead": jobahead.run(
            out, sizes.blockjob_rounds, sizes.blockjob_data)}),
        ("livepause", lambda: {"livepause": livepause.run(out, sizes.blockjob_rounds)}),
    ]


#: Result names of each scenario, for the report of one that failed.
PRODUCES = {"latency": ("latency", "floor", "naive_floor", "original")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the report and logs")
    parser.add_argument("--quick", action="store_true", help="fewer samples (< 10 minutes)")
    parser.add_argument("--only", action="append", default=None, metavar="SCENARIO",
                        help="run only this scenario (repeatable): latency (with floor, "
                        "naive floor and original), lvm_shell, pause_free, fleet, placement, "
                        "qmp_sessions, blockjobs, jobahead, livepause")
    args = parser.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    sizes = QUICK if args.quick else FULL
    results: dict[str, Any] = {}
    not_done: dict[str, str] = {}
    only = {ALIASES.get(name, name) for name in args.only} if args.only else None
    began_all = time.monotonic()
    for name, run in scenarios(out, sizes):
        if only is not None and name not in only:
            continue
        print(f"bench: {name} ...", flush=True)
        began = time.monotonic()
        try:
            produced = run()
        except Exception as err:  # one failed scenario must not hide the others' figures
            for part in PRODUCES.get(name, (name,)):
                not_done[part] = f"failed: {err!r}"
            print(f"bench: {name} failed:\n{traceback.format_exc()}", flush=True)
            continue
        seconds = time.monotonic() - began
        for part, result in produced.items():
            # Parts of one scenario share its wall time.
            results[part] = {**result, "seconds": seconds}
        print(f"bench: {name} done in {seconds:.0f} s", flush=True)
    print(f"bench: all scenarios in {time.monotonic() - began_all:.0f} s", flush=True)
    figures = figures_for(results)
    report = build_report(quick=args.quick, scenarios=results, figures=figures,
                          not_done=not_done, environment=environment(args.quick))
    path = out / "bench.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(table(figures))
    for name, why in not_done.items():
        print(f"not done: {name}: {why}")
    print(f"bench: report {path}", flush=True)
    return 1 if not_done else 0


if __name__ == "__main__":
    sys.exit(main())
