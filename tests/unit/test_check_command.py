"""``pvestord check`` run as a process against a tree of real files.

The node is a temporary folder: the plugin and the LVM profile as files, a
storage.cfg, the extend queue (written through :class:`ExtendQueue`), the
metrics folder, and qmeventd's socket bound by a real listening process
whose command line is qmeventd-py's or qmeventd's. Two stand-ins, named as
such, answer for what a test machine has no node's version of: ``systemctl``
(each unit's state from a file the test writes) and ``lvm`` (a ``pvs`` report
from a file), through ``PVESTORD_SYSTEMCTL`` and ``PVESTORD_LVM``.

Times are never the wall clock's: each unit's StateChangeTimestamp is put
before or after the plugin file's own ctime, as read back from the file.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pvestord.adapters.queue import Entry, ExtendQueue
from pvestord.policy.preflight import PROXMOX_DAEMONS
from pvestord.policy.sizes import GiB, MiB, TiB

REPO = Path(__file__).resolve().parents[2]
MAIN = "import sys; from pvestord.cli import main; sys.exit(main())"

#: A stand-in for ``systemctl show``: one block per unit named, from
#: ``$PVESTORD_TEST_UNITS/<unit>`` when the test wrote one, else not-found.
SYSTEMCTL_STANDIN = """#!/bin/sh
first=1
while [ $# -gt 0 ]; do
    case "$1" in
        show|--timestamp=*) ;;
        -p) shift ;;
        *)
            [ $first = 1 ] || echo
            first=0
            if [ -f "$PVESTORD_TEST_UNITS/$1" ]; then
                cat "$PVESTORD_TEST_UNITS/$1"
            else
                printf 'Id=%s\\nLoadState=not-found\\nActiveState=inactive\\n' "$1"
                printf 'UnitFileState=\\nStateChangeTimestamp=\\n'
            fi ;;
    esac
    shift
done
"""

#: A stand-in for ``lvm``: whatever it is asked, the ``pvs`` report in
#: ``$PVESTORD_TEST_PVS``.
LVM_STANDIN = """#!/bin/sh
cat "$PVESTORD_TEST_PVS"
"""

#: An event server that only listens: binds argv[1], says so, then waits.
LISTENER = """
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1])
s.listen(1)
print("listening", flush=True)
sys.stdin.read()
"""

STORAGE_CFG = """\
lvm: local-thick
\tvgname pve
\tcontent images

pvestord: thin1
\tvgname vgthin
\tshared 1
\tcontent images
\tpvestord-chunksize 1G
"""


@dataclass
class Node:
    root: Path
    env: dict[str, str]
    plugin: Path
    units: Path
    pvs: Path
    socket: Path
    queue: Path

    def args(self) -> list[str]:
        return ["--queue", str(self.queue), "check", "--node", "node1",
                "--storage-config", str(self.root / "storage.cfg"),
                "--plugin", str(self.plugin),
                "--lvm-profile", str(self.root / "pvestord.profile"),
                "--event-socket", str(self.socket),
                "--metrics-dir", str(self.root / "node-exporter")]

    def check(self, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(  # noqa: S603 - argument list
            [sys.executable, "-c", MAIN, *self.args(), *extra], cwd=REPO, env=self.env,
            capture_output=True, text=True, timeout=120, check=False)

    def unit(self, name: str, active: str = "active", *, since: float | None = None,
             load: str = "loaded", enablement: str = "enabled") -> None:
        stamp = f"@{since:.6f}" if since is not None else ""
        (self.units / name).write_text(
            f"Id={name}\nLoadState={load}\nActiveState={active}\n"
            f"UnitFileState={enablement}\nStateChangeTimestamp={stamp}\n")

    def plugin_installed_at(self) -> float:
        return self.plugin.stat().st_ctime

    def daemons_started(self, offset: float) -> None:
        """Every Proxmox daemon active since ``offset`` seconds after the plugin."""
        for daemon in PROXMOX_DAEMONS:
            self.unit(f"{daemon}.service", since=self.plugin_installed_at() + offset)

    def pv_report(self, *, mda_size: int = 128 * MiB, mda_free: int = 64 * MiB,
                  vg_size: int = TiB, vg: str = "vgthin") -> None:
        rows = [{"pv_name": "/dev/sdx", "vg_name": vg, "pv_mda_size": str(mda_size),
                 "pv_mda_free": str(mda_free), "vg_size": str(vg_size)}]
        self.pvs.write_text(json.dumps({"report": [{"pv": rows}]}))


def lines(done: subprocess.CompletedProcess[str], level: str) -> list[str]:
    return [line for line in done.stdout.splitlines() if line.startswith(f"{level}: ")]


@pytest.fixture
def node(tmp_path: Path) -> Node:
    root = tmp_path
    plugin = root / "PvestordPlugin.pm"
    plugin.write_text("package PVE::Storage::Custom::PvestordPlugin;\n1;\n")
    shutil.copy(REPO / "packaging" / "lvm" / "pvestord.profile", root / "pvestord.profile")
    (root / "storage.cfg").write_text(STORAGE_CFG)
    (root / "node-exporter").mkdir()
    (root / "pve").mkdir()
    queue = root / "pve" / "extend-queue"
    ExtendQueue(queue).append([Entry(101, "drive-scsi0", origin="node1")])
    units = root / "units"
    units.mkdir()
    systemctl = root / "systemctl_standin"
    systemctl.write_text(SYSTEMCTL_STANDIN)
    lvm = root / "lvm_pvs_standin"
    lvm.write_text(LVM_STANDIN)
    for standin in (systemctl, lvm):
        standin.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PVESTORD_SYSTEMCTL": str(systemctl),
           "PVESTORD_LVM": str(lvm), "PVESTORD_TEST_UNITS": str(units),
           "PVESTORD_TEST_PVS": str(root / "pvs.json")}
    n = Node(root, env, plugin, units, root / "pvs.json", root / "run" / "qmeventd.sock",
             queue)
    n.socket.parent.mkdir()
    n.daemons_started(offset=+100)
    n.unit("qmeventd.service", "inactive", load="masked", enablement="masked")
    n.pv_report()
    return n


@pytest.fixture
def listener(node: Node) -> Iterator[subprocess.Popen[str]]:
    """qmeventd-py, as far as the check can tell: a process whose command line
    names ``qmeventd-py``, listening on the socket."""
    with listening(node, [sys.executable, str(node.root / "qmeventd-py")]) as proc:
        yield proc


@contextlib.contextmanager
def listening(node: Node, argv: list[str], executable: str | None = None,
            ) -> Iterator[subprocess.Popen[str]]:
    script = Path(argv[-1]) if executable is None else node.root / "listener.py"
    script.write_text(LISTENER)
    if executable is not None:
        argv = [*argv, str(script)]
    proc = subprocess.Popen(  # noqa: S603 - argument list
        [*argv, str(node.socket)], executable=executable, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "listening"
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


@pytest.mark.usefixtures("listener")
def test_a_ready_node_passes_every_check_and_exits_0(node: Node) -> None:
    done = node.check()
    assert done.returncode == 0, done.stdout + done.stderr
    assert not lines(done, "FAIL") and not lines(done, "WARN")
    assert len(lines(done, "PASS")) >= len(PROXMOX_DAEMONS) + 7
    assert any("qmeventd-py listens on" in line for line in lines(done, "PASS"))
    assert any("storage thin1: VG vgthin, chunks of 1 GiB" in line
               for line in lines(done, "PASS"))
    assert done.stdout.splitlines()[-1].startswith("SUMMARY: ")


def test_warnings_alone_exit_2_and_say_what_to_do(node: Node) -> None:
    (node.root / "pvestord.profile").unlink()
    node.unit("qmeventd.service", "inactive", enablement="disabled")
    # Proxmox's qmeventd holds the socket: argv[0] is "qmeventd".
    with listening(node, ["qmeventd"], executable=sys.executable):
        done = node.check()
    assert done.returncode == 2, done.stdout + done.stderr
    warned = lines(done, "WARN")
    assert any("Proxmox's qmeventd listens on" in w and "systemctl mask --now qmeventd" in w
               for w in warned)
    assert any("LVM profile" in w and "apt install --reinstall pvestord" in w for w in warned)
    assert any("qmeventd.service is not masked" in w for w in warned)
    assert not lines(done, "FAIL")


def test_failures_exit_1_and_each_says_what_to_do(node: Node) -> None:
    # pvedaemon runs since before the plugin file; nobody listens on the
    # socket; a storage option is unusable.
    node.unit("pvedaemon.service", since=node.plugin_installed_at() - 100)
    (node.root / "storage.cfg").write_text(STORAGE_CFG.replace("1G", "1Q"))
    done = node.check()
    assert done.returncode == 1, done.stdout + done.stderr
    failed = lines(done, "FAIL")
    assert any(f.startswith("FAIL: pvedaemon runs code from before the storage plugin")
               and "systemctl reload-or-restart pvedaemon" in f for f in failed)
    assert any("nobody listens on" in f and "systemctl enable --now qmeventd-py" in f
               for f in failed)
    assert any("pvestord-chunksize = 1Q" in f and "pvesm set" in f for f in failed)
    for line in failed:
        _, sep, todo = line.partition(" — ")
        assert sep and todo.strip(), f"no advice in {line!r}"
    # The other daemons were reloaded after the plugin: they pass.
    assert any(p == "PASS: pveproxy has loaded the storage plugin" for p in lines(done, "PASS"))


@pytest.mark.usefixtures("listener")
def test_a_vg_whose_metadata_area_is_small_or_full(node: Node) -> None:
    # Debian's default area on a 10 TiB VG in 1 GiB chunks: too small, a warning.
    node.pv_report(mda_size=1_044_480, mda_free=500_000, vg_size=10 * TiB)
    done = node.check()
    assert done.returncode == 2, done.stdout + done.stderr
    assert any("VG vgthin" in w and "--metadatasize 128m" in w for w in lines(done, "WARN"))
    # Told that 1000 extensions is all it will see, the area is enough.
    assert node.check("--extensions", "1000").returncode == 0
    # Nearly full already: a failure.
    node.pv_report(mda_size=1_044_480, mda_free=10_000, vg_size=10 * GiB)
    done = node.check()
    assert done.returncode == 1
    assert any("LVM metadata nearly full" in f for f in lines(done, "FAIL"))
    # The VG not seen at all.
    node.pv_report(vg="othervg")
    assert any("VG vgthin of storage thin1 is not visible" in f
               for f in lines(node.check(), "FAIL"))


@pytest.mark.usefixtures("listener")
def test_the_queue_and_its_lock(node: Node) -> None:
    with node.queue.open("a") as queue:
        queue.write("this is no queue line\n")
    done = node.check()
    assert done.returncode == 2, done.stdout + done.stderr
    assert any("1 line(s) that do not parse" in w and "queue list --rejected" in w
               for w in lines(done, "WARN"))
    assert any(p.startswith("PASS: queue lock") for p in lines(done, "PASS"))
    shutil.rmtree(node.queue.parent)
    done = node.check()
    assert done.returncode == 1
    assert any("does not exist" in f for f in lines(done, "FAIL"))
    assert any(s.startswith("SKIP: queue lock") for s in lines(done, "SKIP"))


@pytest.mark.usefixtures("listener")
def test_json_and_what_is_skipped(node: Node) -> None:
    shutil.rmtree(node.root / "node-exporter")
    for daemon in ("pve-ha-lrm", "pve-ha-crm"):
        (node.units / f"{daemon}.service").unlink()
    done = node.check("--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["status"] == 0 and report["node"] == "node1"
    skipped = {(f["check"], f["what"].split(":")[0]) for f in report["findings"]
               if f["level"] == "SKIP"}
    assert ("plugin", "pve-ha-lrm") in skipped and ("metrics", "no node_exporter folder "
                                                    f"{node.root / 'node-exporter'}") in skipped
    assert all(f["todo"] for f in report["findings"] if f["level"] != "PASS")


def test_without_systemd_the_daemons_are_skipped_not_failed(node: Node) -> None:
    node.env["PVESTORD_SYSTEMCTL"] = str(node.root / "no-such-systemctl")
    done = node.check("--json")
    findings = json.loads(done.stdout)["findings"]
    daemons = [f for f in findings if f["check"] == "plugin" and "systemd not reachable" in
               f["what"]]
    assert len(daemons) == len(PROXMOX_DAEMONS)
    assert all(f["level"] == "SKIP" for f in daemons)


def test_help_explains_each_check(node: Node) -> None:
    done = subprocess.run(  # noqa: S603 - argument list
        [sys.executable, "-c", MAIN, "check", "--help"], cwd=REPO, env=node.env,
        capture_output=True, text=True, timeout=120, check=True)
    for check in ("plugin", "event-socket", "lvm-profile", "storage", "lvm-metadata", "queue",
                  "lock", "metrics"):
        assert f"\n  {check} " in done.stdout
    assert "Exit status: 0 all passed, 1 a failure, 2 warnings only." in done.stdout


def test_a_socket_file_left_behind_or_held_by_another_program(node: Node) -> None:
    # Bound and closed: the file stays, nobody listens (a crashed server's leftover).
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as left:
        left.bind(str(node.socket))
    done = node.check()
    assert any("nobody listens on" in f for f in lines(done, "FAIL"))
    node.socket.unlink()
    with listening(node, [sys.executable, str(node.root / "some-proxy")]):
        done = node.check()
    assert done.returncode == 2, done.stdout + done.stderr
    assert any("some-proxy" in w and "neither qmeventd-py nor qmeventd" in w
               for w in lines(done, "WARN"))


@pytest.mark.usefixtures("listener")
def test_a_queue_lock_held_by_another_fails_with_what_to_do(node: Node) -> None:
    """pmxcfs-style lock directories (``--lock-dir``, as the daemon's): free,
    the lock is taken and released; held (a directory just made, so not
    expired), the check gives up after its few seconds and says why."""
    locks = node.root / "locks"
    locks.mkdir()
    done = node.check("--lock-dir", str(locks))
    assert done.returncode == 0, done.stdout + done.stderr
    assert not list(locks.iterdir())
    (locks / "file-extend-queue").mkdir()
    done = node.check("--lock-dir", str(locks))
    assert done.returncode == 1
    failed = [f for f in lines(done, "FAIL") if f.startswith("FAIL: queue lock")]
    assert failed and "pvecm status" in failed[0]
