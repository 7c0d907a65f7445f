"""How much pvestord's ``--config`` (lvm.FAST_CONFIG) saves per ``lvextend``.

Runs inside the node guest (``python -m tests.harness.nodeguest --out out/bench
--exec python -m bench.lvm_config``): N extensions of one LV with LVM's default
settings and N with FAST_CONFIG, interleaved so both see the same machine
load, then prints medians and writes a JSON report.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

from pvestord.adapters.lvm import FAST_CONFIG
from tests.harness.lvmbed import MiB, loop_vg

TIMEOUT = 60.0


def lvextend(vg: str, lv: str, size: int, fast: bool) -> float:
    argv = ["lvm", "lvextend", "-q", "--size", f"{size}b", f"{vg}/{lv}"]
    if fast:
        argv[2:2] = ["--config", FAST_CONFIG]
    started = time.perf_counter()
    subprocess.run(argv, check=True, timeout=TIMEOUT, capture_output=True,  # noqa: S603
                   stdin=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=Path,
                        default=Path(os.environ.get("PVESTORD_TEST_OUT", "out/bench")))
    args = parser.parse_args()
    times: dict[str, list[float]] = {"default": [], "fast": []}
    with loop_vg(4096 * MiB, prefix="bench") as vg:
        vg.create_lv("lv", 8 * MiB)
        size = 8 * MiB
        for _ in range(args.rounds):
            for mode in ("default", "fast"):
                size += 4 * MiB
                times[mode].append(lvextend(vg.name, "lv", size, mode == "fast"))
        assert vg.lv_size("lv") == size == vg.device_size("lv")
    report = {mode: {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t),
                     "n": len(t)} for mode, t in times.items()}
    report["fast_over_default"] = {"median": report["fast"]["median_s"]
                                   / report["default"]["median_s"]}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "lvm_config.json"
    path.write_text(json.dumps(report, indent=2))
    for mode in ("default", "fast"):
        r = report[mode]
        print(f"lvextend {mode:8} median {r['median_s']:.3f} s  min {r['min_s']:.3f}  "
              f"max {r['max_s']:.3f}  (n={r['n']})")
    print(f"fast/default median: {report['fast_over_default']['median']:.2f}; report {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
