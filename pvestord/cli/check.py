"""``pvestord check [--json]``: a preflight of this node, as Proxmox's ``pve8to9``.

One line per finding, ``PASS|WARN|FAIL|SKIP: what — what to do``, then a
summary. Exit status 0 when everything passed (or was skipped), 1 with a
failure, 2 with warnings only: a script, or the admin's shell, can tell
"broken" from "works, but look".
"""

from __future__ import annotations

import argparse
import inspect
import json
from pathlib import Path

from pvestord import paths
from pvestord.adapters import keptsections
from pvestord.adapters.settings import DaemonSettings
from pvestord.cli.options import SubCommands, add_command, add_json_option
from pvestord.engine import metrics
from pvestord.features import preflight
from pvestord.policy.preflight import PROXMOX_DAEMONS, exit_status, summary

CHECKS = f"""checks, in the order they are printed:
  plugin        the storage plugin file is there (--plugin), and each Proxmox
                daemon ({', '.join(PROXMOX_DAEMONS[:3])},
                {', '.join(PROXMOX_DAEMONS[3:])}) has started or
                reloaded since the file was put in place (systemd's
                StateChangeTimestamp against the file's ctime): a daemon that
                has not knows no 'pvestord:' storage
  event-socket  who listens on qmeventd's socket (--event-socket): qmeventd-py,
                Proxmox's qmeventd, another program or nobody, from
                /proc/net/unix and /proc/<pid>/fd; and qmeventd.service masked
  lvm-profile   the LVM profile (--lvm-profile) sets what pvestord's persistent
                lvm shells need (else every LVM command is a process: slower)
  storage       storage.cfg reads, and each thin storage's options, in words;
                fails for a pvestord: storage gone from it whose section the
                daemon kept (--state-dir): an edit from a node without the plugin
  lvm-metadata  each thin VG's metadata area (pvs) against the extensions its
                thin disks can make: VG size / smallest chunk, or --extensions;
                fails when the area is nearly full already
  queue         the extend queue reads and its lines parse (--queue)
  lock          the queue lock can be taken (and is released at once)
  metrics       node_exporter's textfile folder is there and writable

Run it as root on each node after installing or upgrading pvestord, after
editing storage.cfg, and before relying on a new thin VG.
Exit status: 0 all passed, 1 a failure, 2 warnings only."""


def register(sub: SubCommands) -> None:
    # Raw, for the table of checks; the description is then the docstring as
    # written, its indentation taken off.
    p = add_command(sub, "check", _run, "a preflight of this node: every finding says what to do",
                    description=inspect.cleandoc(_run.__doc__ or ""), epilog=CHECKS,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    add_json_option(p, help="the findings as JSON")
    p.add_argument("--storage-config", type=Path, default=paths.STORAGE_CFG,
                   metavar="PATH", help="storage.cfg (default: %(default)s)")
    p.add_argument("--lock-dir", type=Path, default=None, metavar="DIR",
                   help="pmxcfs-style lock directories in DIR, as 'pvestord run --lock-dir'"
                   " (default: chosen by where the queue lives)")
    p.add_argument("--node", default=None, metavar="NAME",
                   help="this node's name in the cluster (default: short host name)")
    p.add_argument("--extensions", type=int, default=None, metavar="N",
                   help="how many extensions each thin VG's metadata must hold (default: its"
                   " size divided by its smallest chunk)")
    p.add_argument("--plugin", type=Path, default=preflight.PLUGIN, metavar="PATH",
                   help="the storage plugin file (default: %(default)s)")
    p.add_argument("--lvm-profile", type=Path, default=preflight.LVM_PROFILE, metavar="PATH",
                   help="the LVM profile (default: %(default)s)")
    p.add_argument("--event-socket", type=Path, default=paths.QMEVENTD_SOCKET,
                   metavar="PATH", help="qmeventd's socket (default: %(default)s)")
    p.add_argument("--state-dir", type=Path, default=paths.STATE_DIR, metavar="DIR",
                   help="the daemon's state folder, with its copy of the pvestord sections"
                   " (default: %(default)s)")
    p.add_argument("--metrics-dir", type=Path,
                   default=metrics.METRICS_FILE.parent,
                   metavar="DIR", help="node_exporter's textfile folder (default: %(default)s)")


def _run(args: argparse.Namespace) -> int:
    """Check that this node is ready for thin disks: the storage plugin loaded
    by each Proxmox daemon, the event socket's listener, the LVM profile, each
    thin storage's settings, each thin VG's metadata room, the extend queue and
    its lock, the metrics folder. Each finding that is not a pass says what to
    do."""
    # The daemon's own validation of what the options say (and its node name).
    values: dict[str, object] = {"queue": args.queue, "storage_config": args.storage_config,
                                 "lock_dir": args.lock_dir}
    if args.node:
        values["node"] = args.node
    settings = DaemonSettings(**values)  # type: ignore[arg-type]
    where = preflight.Where(
        node=settings.node, queue=settings.queue, storage_config=settings.storage_config,
        lock_dir=settings.lock_dir, plugin=args.plugin, lvm_profile=args.lvm_profile,
        event_socket=args.event_socket, metrics_dir=args.metrics_dir,
        extensions=args.extensions, kept_sections=args.state_dir / keptsections.FILE_NAME)
    findings = preflight.run_checks(where)
    status = exit_status(findings)
    if args.json:
        print(json.dumps({
            "node": where.node, "status": status, "summary": summary(findings),
            "findings": [{"check": f.check, "level": f.level.name, "what": f.what,
                          "todo": f.todo} for f in findings]}, indent=1))
    else:
        for finding in findings:
            print(finding.line())
        print(summary(findings))
    return status
