"""A shared VG's LVM metadata running out, with real LVM (node guest).

Every chunk extension of an LV whose neighbour grew in between adds a segment
to the VG's metadata; when the metadata area is full, every ``lvextend`` and
``lvcreate`` in the VG fails. pvestord's periodic VG probe reads
``vg_mda_free``/``vg_mda_size`` and warns, once per crossing, when less than a
quarter of the room is left (:func:`pvestord.policy.lvmetadata.metadata_low`). Here a
VG gets the smallest metadata area LVM allows (32 KiB) and two LVs extended in
turn, one extent at a time, through one ``lvm`` shell per batch.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pvestord.policy.lvmetadata import metadata_low
from tests.harness.daemonlog import LogLine, parse
from tests.harness.daemons import Daemon, NodeBed, ThinStorageSpec, start_pvestord
from tests.harness.lvmbed import scratch_dir, sh
from tests.harness.polling import wait_until

MiB = 1024 * 1024
#: The smallest metadata area LVM accepts, the data right after it.
METADATA_SIZE, DATA_ALIGNMENT = "32k", "4k"
#: Extensions per ``lvm`` shell run (the shell saves LVM's start-up per command).
BATCH = 10
REPORT_INTERVAL = "1"
REPORT_TIMEOUT = 60.0
LVM_BATCH_TIMEOUT = 300.0


@contextlib.contextmanager
def small_metadata_vg() -> Iterator[str]:
    backing = scratch_dir() / f"pv-{secrets.token_hex(4)}.img"
    with backing.open("wb") as f:
        f.truncate(512 * MiB)
    device = sh("losetup", "--find", "--show", str(backing)).strip()
    name = f"pvtmda{secrets.token_hex(3)}"
    try:
        sh("pvcreate", "-q", "--metadatasize", METADATA_SIZE, "--dataalignment",
           DATA_ALIGNMENT, device)
        sh("vgcreate", "-q", "-s", "1m", name, device)
        for lv in ("a", "b"):
            sh("lvcreate", "-q", "-an", "-Zn", "-L", "1m", "-n", lv, name)
        yield name
    finally:
        sh("vgremove", "-q", "-f", name, check=False)
        sh("pvremove", "-q", "-ff", "-y", device, check=False)
        sh("losetup", "-d", device, check=False)
        backing.unlink(missing_ok=True)


def mda(vg: str) -> tuple[int, int]:
    """``(vg_mda_free, vg_mda_size)`` as LVM reports them now."""
    out = sh("vgs", "--reportformat", "json", "--units", "b", "--nosuffix", "-o",
             "vg_mda_free,vg_mda_size", vg)
    row = json.loads(out)["report"][0]["vg"][0]
    return int(row["vg_mda_free"]), int(row["vg_mda_size"])


def extend_in_turn(vg: str, lvs: tuple[str, ...], count: int) -> None:
    """``count`` one-extent extensions, the LVs in turn: one new segment each."""
    commands = "".join(f"lvextend -q -An -l +1 {vg}/{lvs[i % len(lvs)]}\n"
                       for i in range(count))
    done = subprocess.run(["lvm"], input=commands, capture_output=True, text=True,
                          timeout=LVM_BATCH_TIMEOUT, check=False)
    assert done.returncode == 0, done.stderr


def segments(vg: str) -> int:
    out = sh("lvs", "--noheadings", "-o", "seg_count", vg)
    return sum(int(n) for n in out.split())


def metadata_lines(daemon: Daemon) -> list[LogLine]:
    return [line for line in parse(daemon.log_text()) if "MDA_FREE" in line.fields]


def published(bed: NodeBed) -> dict[str, object]:
    path = bed.root / "nodes" / bed.node / "pvestord.json"
    with contextlib.suppress(OSError, ValueError):
        report: dict[str, object] = json.loads(path.read_text())
        return report
    return {}


def wait_reports(bed: NodeBed, count: int) -> None:
    """Until ``count`` more reports than now are published (each is one probe)."""
    seen: list[float] = []

    def newer() -> bool:
        when = float(published(bed).get("time", 0.0))  # type: ignore[arg-type]
        if not seen or when > seen[-1]:
            seen.append(when)
        return len(seen) > count
    wait_until(newer, REPORT_TIMEOUT, f"{count} node reports")


@pytest.mark.faults_full
def test_metadata_running_low_is_warned_once_per_crossing(tmp_path: Path, out_dir: Path) -> None:
    with small_metadata_vg() as vg:
        bed = NodeBed(tmp_path, [ThinStorageSpec("meta1", vg)], logs_dir=out_dir)
        free, size = mda(vg)
        figures: dict[str, object] = {"mda_size": size, "mda_free_start": free,
                                      "segments_start": segments(vg)}
        daemon = start_pvestord(bed, "--report-interval", REPORT_INTERVAL)
        try:
            extended = 0
            began = time.monotonic()
            while not metadata_low(*mda(vg)):
                wait_reports(bed, 1)
                assert metadata_lines(daemon) == [], "warned while there was room"
                extend_in_turn(vg, ("a", "b"), BATCH)
                extended += BATCH
                assert extended < 400, "the metadata never ran low"
            low_free, _ = mda(vg)
            figures.update(extensions_to_low=extended, mda_free_low=low_free,
                           segments_low=segments(vg), seconds=time.monotonic() - began,
                           bytes_per_extension=(free - low_free) / extended)
            wait_until(lambda: metadata_lines(daemon), REPORT_TIMEOUT, "the metadata warning")
            warning = metadata_lines(daemon)
            assert [(w.level, w.fields["VG"], w.fields["MDA_SIZE"]) for w in warning] == [
                ("WARNING", vg, str(size))]
            assert int(warning[0].fields["MDA_FREE"]) <= free
            report = published(bed)["storages"]["meta1"]  # type: ignore[index]
            assert (report["mda_free"], report["mda_size"]) == mda(vg)

            extend_in_turn(vg, ("a", "b"), BATCH)            # lower still: no second warning
            wait_reports(bed, 2)
            assert len(metadata_lines(daemon)) == 1

            sh("lvremove", "-q", "-f", f"{vg}/b")            # segments gone: room again
            assert not metadata_low(*mda(vg))
            wait_until(lambda: len(metadata_lines(daemon)) == 2, REPORT_TIMEOUT,
                       "the all-clear")
            assert metadata_lines(daemon)[1].level == "INFO"
            sh("lvcreate", "-q", "-an", "-Zn", "-L", "1m", "-n", "c", vg)
            again = 0
            while not metadata_low(*mda(vg)):                # and the next crossing warns
                extend_in_turn(vg, ("a", "c"), BATCH)
                again += BATCH
                assert again < 400
            wait_until(lambda: len(metadata_lines(daemon)) == 3, REPORT_TIMEOUT,
                       "the second warning")
            assert [w.level for w in metadata_lines(daemon)] == ["WARNING", "INFO", "WARNING"]
            figures["extensions_to_low_again"] = again
        finally:
            (out_dir / "metadata.json").write_text(json.dumps(figures, indent=2))
            assert daemon.stop() == 0
