"""The status view in Prometheus's text format, for node_exporter's textfile collector.

A file rather than an HTTP endpoint: node_exporter already runs on most
monitored Proxmox nodes and already serves ``/var/lib/prometheus/node-exporter``
(Debian's ``prometheus-node-exporter`` reads ``*.prom`` there), so there is no
port to open, no listener in the daemon, and no new scrape target. The file
is replaced atomically, as the collector requires.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Debian's node_exporter textfile folder.
METRICS_FILE = Path("/var/lib/prometheus/node-exporter/pvestord.prom")


def _label(value: object) -> str:
    text = str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return f'"{text}"'


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]

    def sample(self, name: str, value: float, labels: Mapping[str, object] | None = None) -> None:
        shown = ",".join(f"{k}={_label(v)}" for k, v in (labels or {}).items())
        # Exact: byte counts are past %g's six digits.
        number = str(value) if isinstance(value, int) else repr(float(value))
        self.lines.append(f"{name}{{{shown}}} {number}" if shown else f"{name} {number}")


def render(view: Mapping[str, Any]) -> str:
    """The metrics of one status view (:func:`pvestord.engine.status.snapshot`)."""
    out = _Writer()
    ext = view["extensions"]
    out.family("pvestord_extensions_total", "counter", "Thin LV extensions made.")
    out.sample("pvestord_extensions_total", ext["made"])
    out.family("pvestord_extension_failures_total", "counter",
               "Thin LV extensions that failed (retried after a backoff).")
    out.sample("pvestord_extension_failures_total", ext["failed"])
    out.family("pvestord_extension_latency_seconds", "histogram",
               "From the start of the round that handled the event to the LV extended.")
    for bound, count in zip(ext["latency_buckets_ms"], ext["latency_counts"], strict=True):
        out.sample("pvestord_extension_latency_seconds_bucket", count,
                   {"le": f"{bound / 1000:g}"})
    out.sample("pvestord_extension_latency_seconds_bucket", ext["made"], {"le": "+Inf"})
    out.sample("pvestord_extension_latency_seconds_sum", ext["latency_sum_ms"] / 1000)
    out.sample("pvestord_extension_latency_seconds_count", ext["made"])
    out.family("pvestord_lock_wait_seconds_total", "counter",
               "Time extensions waited for the cluster-wide storage lock.")
    out.sample("pvestord_lock_wait_seconds_total", ext["lock_wait_ms_total"] / 1000)
    out.family("pvestord_paused_vms", "gauge", "VMs paused on ENOSPC on this node.")
    out.sample("pvestord_paused_vms", view["paused_vms"])
    out.family("pvestord_queue_length", "gauge", "Entries in the cluster extend queue.")
    out.sample("pvestord_queue_length", view["queue_length"])
    out.family("pvestord_lvm_shell_restarts_total", "counter",
               "Persistent lvm shells started again after one ended.")
    out.sample("pvestord_lvm_shell_restarts_total", view["lvm_shell_restarts"])
    counts = view.get("tally", {})
    out.family("pvestord_commands_started_total", "counter",
               "External programs started (lvm, qemu-img, ...), by program.")
    for program, count in counts.get("commands", {}).items():
        out.sample("pvestord_commands_started_total", count, {"program": program})
    events = counts.get("events", {})
    for name, key, help_text in (
            ("pvestord_qmp_sessions_total", "qmp_session", "QMP sessions opened with VMs."),
            ("pvestord_cluster_writes_total", "cluster_write",
             "Cluster files (queue, node report) replaced."),
            ("pvestord_cluster_lock_attempts_total", "cluster_lock_attempt",
             "Attempts at a pmxcfs lock directory."),
            ("pvestord_lv_resumed_total", "dm_resumed",
             "LVs found left suspended (a killed LVM change) and resumed."),
            ("pvestord_lv_resume_failures_total", "dm_resume_failed",
             "Attempts to resume an LV left suspended that failed: a guest's I/O hangs.")):
        out.family(name, "counter", help_text)
        out.sample(name, events.get(key, 0))
    out.family("pvestord_storage_vanished", "gauge",
               "1: this pvestord storage is gone from storage.cfg (an edit on a node"
               " without the plugin?); 0: it is there. See 'pvestord status'.")
    for row in view.get("storages", []):
        out.sample("pvestord_storage_vanished", int(row["vanished"] is not None),
                   {"storage": row["storage"]})
    vgs: Mapping[str, Mapping[str, Any]] = view["vgs"]
    gauges = (("pvestord_vg_size_bytes", "size", "Size of the thin VG."),
              ("pvestord_vg_free_bytes", "free", "Free space of the thin VG."),
              ("pvestord_vg_thin_allocated_bytes", "thin_allocated",
               "Sum of the thin LVs' sizes."),
              ("pvestord_vg_thin_virtual_bytes", "thin_virtual",
               "Sum of the thin LVs' maxima (recorded in their tags; untagged LVs at their size)."),
              ("pvestord_vg_thin_unrecorded_lvs", "unmeasured",
               "Thin LVs with no recorded maximum, counted at their size: the"
               " maxima and overcommit are a floor while above 0."),
              ("pvestord_vg_overcommit_ratio", "overcommit",
               "What the VG would need if every thin LV filled, over its size."),
              ("pvestord_vg_time_to_full_seconds", "time_to_full",
               "Projected time to full at the last hour's growth (absent: not filling)."))
    for name, key, help_text in gauges:
        out.family(name, "gauge", help_text)
        for vg, account in vgs.items():
            if account.get(key) is not None:
                out.sample(name, account[key], {"vg": vg})
    return "\n".join(out.lines) + "\n"
