"""The two-node bed: two node guests sharing one SAN disk, driven from the host.

Facts it relies on are in ``docs/testing.md`` ("The two-node bed"). Each guest is the node
guest of :mod:`tests.harness.nodeguest` (Debian's kernel under virtme-ng,
dm-mod, the host's root read-only) with, in addition:

* the SAN: one sparse raw file on the host given to both QEMUs as a
  virtio-blk disk with ``share-rw=on`` and ``cache.direct=on``;
* a private link for migration: a dgram unix-socket netdev between the two
  QEMUs (no host networking), addressed inside the guests;
* the work folder, shared writable with both (``--rwdir``, 9p without
  caching). Its ``pve/`` stands in for ``/etc/pve``: the extend queue,
  ``storage.cfg`` and ``priv/lock`` (pmxcfs-style lock directories: ``mkdir``
  is atomic across the guests, ``flock`` is not).

Each guest runs :mod:`tests.harness.nodeagent` on ``<work>/<node>/agent``; the
host talks to it with request files (:meth:`Node.call`, :meth:`Node.run`).
The pair is booted once per pytest session (``tests/integration/cluster``);
a pair that does not come up in time is killed and reported with the tail of
both consoles.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import subprocess
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pvestord.adapters.lvm import FAST_CONFIG
from tests.harness.daemonlog import records
from tests.harness.inguest import STARTED_MARKER
from tests.harness.nodeguest import (
    BEDS,
    BOOT_ATTEMPTS,
    DEFAULT_BED,
    Bed,
    GuestError,
    compile_repository,
    vng_argv,
    vng_env,
)
from tests.harness.polling import wait_until
from tests.harness.qemu import Pve9Disk

REPO = Path(__file__).resolve().parents[2]
#: Boot of both guests at once under TCG: 19-24 s on an idle machine (docs/testing.md);
#: a busy machine (other guests running) takes several times that.
BOOT_TIMEOUT = 300.0
#: A guest that does not power off after ``quit`` is killed after this.
SHUTDOWN_TIMEOUT = 60.0
#: Budget for one agent request when the caller gives none.
CALL_TIMEOUT = 120.0
SAN_SIZE = 4 * 1024**3
SCRATCH = "/srv/pvestord-test"
CONSOLE_TAIL = 40

NODES = {"nodea": ("52:54:00:99:00:01", "10.99.0.1"),
         "nodeb": ("52:54:00:99:00:02", "10.99.0.2")}


class AgentError(Exception):
    """A request failed in the guest, or got no answer in time."""


@dataclass(frozen=True)
class RunResult:
    rc: int
    stdout: str
    stderr: str
    duration: float


@dataclass(eq=False)
class Node:
    """One guest of the pair, seen from the host."""

    name: str
    addr: str
    dir: Path
    proc: subprocess.Popen[str] | None = None
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=CONSOLE_TAIL))

    @property
    def agent_dir(self) -> Path:
        return self.dir / "agent"

    @property
    def logs(self) -> Path:
        return self.dir / "logs"

    @property
    def console_log(self) -> Path:
        return self.dir / "console.log"

    @property
    def run_dir(self) -> str:
        """qemu-server's run folder on this node (the guest's own tmpfs)."""
        return f"{SCRATCH}/run"

    @property
    def event_socket(self) -> str:
        return f"{SCRATCH}/qmeventd.sock"

    def call(self, op: str, *, timeout: float = CALL_TIMEOUT, **fields: Any) -> Any:
        """One request to this node's agent; its result, or :class:`AgentError`."""
        rid = f"{time.time_ns()}-{secrets.token_hex(3)}"
        req_dir = self.agent_dir / "req"
        tmp = req_dir / f".{rid}.tmp"
        tmp.write_text(json.dumps({"op": op, **fields}))
        tmp.rename(req_dir / f"{rid}.json")
        res = self.agent_dir / "res" / f"{rid}.json"
        deadline = time.monotonic() + timeout
        while not res.exists():
            if self.proc is not None and self.proc.poll() is not None:
                raise AgentError(f"{self.name} powered off during {op}; console:\n"
                                 + "\n".join(self.tail))
            if time.monotonic() > deadline:
                raise AgentError(f"{self.name}: no answer to {op} {fields} within {timeout:g} s")
            time.sleep(0.02)
        reply = json.loads(res.read_text())
        res.unlink()
        if "error" in reply:
            raise AgentError(f"{self.name}: {op} failed: {reply['error']}: {reply['message']}\n"
                             f"{reply.get('traceback', '')}")
        return reply["result"]

    def run(self, argv: list[str], *, timeout: float = CALL_TIMEOUT,
            check: bool = True) -> RunResult:
        """Run a command in the guest; with ``check`` a failure raises with its stderr."""
        r = RunResult(**self.call("run", argv=argv, cmd_timeout=timeout, timeout=timeout + 30))
        if check and r.rc != 0:
            raise AgentError(f"{self.name}: {shlex.join(argv)} exited {r.rc}: {r.stderr.strip()}")
        return r

    def sh(self, *argv: str, timeout: float = CALL_TIMEOUT) -> str:
        return self.run(list(argv), timeout=timeout).stdout

    def vm(self, vmid: int, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call a :class:`tests.harness.qemu.QemuVM` method on the VM kept by the agent.

        A ``timeout`` keyword goes to the method; the request's own budget is that
        plus :data:`CALL_TIMEOUT`.
        """
        budget = float(kwargs.get("timeout", 0)) + CALL_TIMEOUT
        return self.call("vm", vmid=vmid, method=method, args=list(args), kwargs=kwargs,
                         timeout=budget)

    # -- daemons

    def start_daemons(self, cluster: Cluster, *, poll: float = 1.0,
                      timeout: float = 300.0, wait: bool = True) -> None:
        """qmeventd-py and pvestord on this node, with the cluster's queue and lock dirs.

        ``wait=False`` returns before pvestord is ready, so that both nodes'
        daemons start together (each takes about 30 s under TCG); then
        :meth:`wait_started`."""
        self.logs.mkdir(parents=True, exist_ok=True)
        pve = cluster.pve
        self.call("spawn", name="qmeventd", log=str(self.logs / "qmeventd.log"), argv=[
            str(cluster.bin / "qmeventd-py"), "--socket", self.event_socket,
            "--queue", str(pve / "extend-queue"), "--lock-dir", str(cluster.lock_dir),
            "--no-cleanup", "-f", "-v", "--node", self.name])
        self.start_pvestord(cluster, poll=poll, timeout=timeout, wait=wait)

    def start_pvestord(self, cluster: Cluster, *, poll: float = 1.0, timeout: float = 300.0,
                       log: str = "pvestord", env: dict[str, str] | None = None,
                       report_interval: float = 10.0, wait: bool = True) -> None:
        """pvestord on this node, logging to ``logs/<log>.log`` (a restarted one
        gets a file of its own, so that its records are never its
        predecessor's). Each node report costs a ``vgs``, seconds of emulated
        CPU: the ranking test asks for them more often than the default."""
        self.logs.mkdir(parents=True, exist_ok=True)
        pve = cluster.pve
        self.call("spawn", name="pvestord", log=str(self.logs / f"{log}.log"), env=env or {},
                  argv=[
            str(cluster.bin / "pvestord"), "--queue", str(pve / "extend-queue"), "-v", "run",
            "--storage-config", str(pve / "storage.cfg"), "--run-dir", self.run_dir,
            "--state-dir", f"{self.run_dir}/state",
            "--lock-dir", str(cluster.lock_dir), "--node", self.name, "--no-journal",
            "--poll-interval", str(poll), "--report-interval", str(report_interval)])
        if wait:
            self.wait_started(timeout=timeout)

    def wait_started(self, timeout: float = 300.0) -> None:
        """Until pvestord notifies ``READY=1``, as systemd hears it."""
        self.call("ready", name="pvestord", timeout=timeout + CALL_TIMEOUT, wait=timeout)

    def stop_daemons(self) -> dict[str, int | None]:
        return {name: self.call("stop", name=name)["rc"] for name in ("pvestord", "qmeventd")}

    def log_text(self, log: str) -> str:
        path = self.logs / f"{log}.log"
        return path.read_text(errors="replace") if path.exists() else ""


@dataclass
class Cluster:
    """Both nodes, the SAN and the shared ``pve`` folder."""

    work: Path
    a: Node
    b: Node
    san: Path
    #: What each node boots; its Python's folder holds the daemons' scripts.
    bed: Bed
    vg: str = ""
    boot_seconds: float = 0.0

    @property
    def bin(self) -> Path:
        """The guests' venv ``bin``: their Python, ``pvestord``, ``qmeventd-py``."""
        return self.bed.python.parent

    @property
    def nodes(self) -> tuple[Node, Node]:
        return (self.a, self.b)

    @property
    def pve(self) -> Path:
        return self.work / "pve"

    @property
    def lock_dir(self) -> Path:
        return self.pve / "priv" / "lock"

    def write_storage_config(self, text: str) -> None:
        tmp = self.pve / ".storage.cfg.tmp"
        tmp.write_text(text)
        tmp.rename(self.pve / "storage.cfg")


def _san_device(node: Node) -> str:
    """The SAN disk inside ``node``: the virtio disk with serial SAN0."""
    out = node.sh("sh", "-c", "grep -l '^SAN0$' /sys/block/*/serial")
    return "/dev/" + out.strip().split("/")[3]


def _qemu_opts(work: Path, name: str, san: Path) -> str:
    mac, _ = NODES[name]
    other = "nodeb" if name == "nodea" else "nodea"
    # One string: vng joins its options into a shell command line (docs/testing.md,
    # "The two-node bed": the '=' form, or its parser takes the value for an option).
    return " ".join([
        "-blockdev", f"driver=file,filename={san},node-name=san0,cache.direct=on",
        "-device", "virtio-blk-pci,drive=san0,share-rw=on,serial=SAN0",
        "-netdev", f"dgram,id=n1,local.type=unix,local.path={work}/{name}.net,"
                   f"remote.type=unix,remote.path={work}/{other}.net",
        "-device", f"virtio-net-pci,netdev=n1,mac={mac}"])


def _boot(work: Path, node: Node, san: Path, memory: str, bed: Bed, *,
          kernel_messages: bool = False) -> None:
    mac, addr = NODES[node.name]
    (node.dir / STARTED_MARKER).unlink(missing_ok=True)
    # A node booted again binds its end of the pair's link anew.
    (work / f"{node.name}.net").unlink(missing_ok=True)
    inner = [str(bed.python), "-m", "tests.harness.inguest", "--out", str(node.dir),
             "exec", str(bed.python), "-m", "tests.harness.nodeagent",
             "--dir", str(node.agent_dir), "--mac", mac, "--addr", f"{addr}/24"]
    argv = vng_argv(f"cd {shlex.quote(str(REPO))} && " + shlex.join(inner), work,
                    memory=memory, cpus=1, name=node.name, bed=bed,
                    kernel_messages=kernel_messages)
    argv.append("--qemu-opts=" + _qemu_opts(work, node.name, san))
    env = vng_env()
    # A second boot's console follows the first one's.
    log = node.console_log.open("a" if kernel_messages else "w")
    node.proc = subprocess.Popen(  # noqa: S603 - argument list
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=env, text=True, errors="replace", start_new_session=True)

    def pump() -> None:
        # Piped, never a file: docs/testing.md, "The node guest" (QEMU's file chardevs garble it).
        assert node.proc is not None and node.proc.stdout is not None
        for line in node.proc.stdout:
            log.write(line)
            log.flush()
            node.tail.append(line.rstrip("\n"))
        log.close()

    threading.Thread(target=pump, daemon=True, name=f"console-{node.name}").start()


def _kill(node: Node) -> None:
    if node.proc is not None and node.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.proc.pid, 9)
        node.proc.wait(timeout=30)


def _consoles(cluster: Cluster) -> str:
    return "\n".join(f"--- {n.name} (full console {n.console_log}):\n" + "\n".join(n.tail)
                     for n in cluster.nodes)


@contextlib.contextmanager
def cluster_pair(work: Path, *, boot_timeout: float = BOOT_TIMEOUT,
                 memory: str = "2G", bed: str = DEFAULT_BED) -> Iterator[Cluster]:
    """Boot both guests, make the shared VG, yield; power both off at the end.

    ``bed``: what the nodes boot (nodeguest.BEDS: the host's root, or Debian 13's)."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    san = work / "san.img"
    with san.open("wb") as f:
        f.truncate(SAN_SIZE)
    a, b = (Node(name, NODES[name][1], work / name) for name in NODES)
    cluster = Cluster(work, a, b, san=san, bed=BEDS[bed]())
    for sub in ("pve/priv/lock",):
        (work / sub).mkdir(parents=True)
    (cluster.pve / "extend-queue").write_text("")
    started = time.monotonic()
    compile_repository(cluster.bed)
    try:
        for node in cluster.nodes:
            node.agent_dir.mkdir(parents=True)
            _boot(work, node, san, memory, cluster.bed)
        boots = {node.name: 1 for node in cluster.nodes}
        for node in cluster.nodes:
            while not (node.agent_dir / "ready").exists():
                if node.proc is not None and node.proc.poll() is not None:
                    ran_nothing = not (node.dir / STARTED_MARKER).exists()
                    if ran_nothing and boots[node.name] < BOOT_ATTEMPTS:
                        # As nodeguest.run_guest: it ran nothing, so boot it again,
                        # with the kernel's messages on its console.
                        print(f"twonode: {node.name} exited {node.proc.returncode} before "
                              "running our command; it boots once more", flush=True)
                        boots[node.name] += 1
                        _boot(work, node, san, memory, cluster.bed, kernel_messages=True)
                        continue
                    raise GuestError(f"{node.name} exited {node.proc.returncode} before its "
                                     "agent was ready:\n" + _consoles(cluster))
                if time.monotonic() - started > boot_timeout:
                    raise GuestError(f"the pair did not boot within {boot_timeout:g} s:\n"
                                     + _consoles(cluster))
                time.sleep(0.2)
        cluster.boot_seconds = time.monotonic() - started
        _make_vg(cluster)
        (work / "bed.json").write_text(json.dumps({"vg": cluster.vg, "bed": cluster.bed.name,
                                                   "boot_seconds": cluster.boot_seconds}))
        yield cluster
    finally:
        for node in cluster.nodes:
            if node.proc is not None and node.proc.poll() is None:
                with contextlib.suppress(AgentError):
                    node.call("quit", timeout=10)
        deadline = time.monotonic() + SHUTDOWN_TIMEOUT
        for node in cluster.nodes:
            if node.proc is not None:
                try:
                    node.proc.wait(timeout=max(deadline - time.monotonic(), 1))
                except subprocess.TimeoutExpired:
                    _kill(node)
        san.unlink(missing_ok=True)


def attach(work: Path) -> Cluster:
    """A pair already booted by ``python -m tests.harness.twonode --keep`` (for
    working on the tests without a boot per run)."""
    info = json.loads((work / "bed.json").read_text())
    a, b = (Node(name, NODES[name][1], work / name) for name in NODES)
    cluster = Cluster(work, a, b, san=work / "san.img", bed=BEDS[info.get("bed", "host")](),
                      vg=info["vg"], boot_seconds=info["boot_seconds"])
    for node in cluster.nodes:
        node.call("ping", timeout=10)
    return cluster


def main() -> int:
    """Boot the pair and keep it until SIGTERM/SIGINT: ``PVESTORD_CLUSTER_ATTACH=1
    make cluster`` then runs the tests against it."""
    import signal

    work = REPO / "out" / "cluster"
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with cluster_pair(work) as cluster:
        print(f"two-node bed up in {cluster.boot_seconds:.1f} s: VG {cluster.vg}; "
              f"{work}/bed.json", flush=True)
        stop.wait()
    (work / "bed.json").unlink(missing_ok=True)
    return 0


def _make_vg(cluster: Cluster) -> None:
    """The shared VG, created on A and found by B (``pvscan --cache``)."""
    dev_a = _san_device(cluster.a)
    cluster.vg = "san" + secrets.token_hex(2)
    cluster.a.sh("pvcreate", "-q", dev_a)
    cluster.a.sh("vgcreate", "-q", "-s", "4m", cluster.vg, dev_a)
    cluster.b.sh("pvscan", "--cache")
    vgs = cluster.b.sh("vgs", "--noheadings", "-o", "vg_name")
    if cluster.vg not in vgs.split():
        raise GuestError(f"nodeb does not see VG {cluster.vg} after pvscan: {vgs!r}")


# -- thin volumes and VMs on the bed

MiB = 1024**2
GiB = 1024**3


#: The shared storage's id (storage_section's default).
STOREID = "san"


def storage_section(cluster: Cluster, *, storeid: str = STOREID, chunksize: str = "32M",
                    initial: str = "64M") -> str:
    return (f"pvestord: {storeid}\n\tvgname {cluster.vg}\n\tcontent images\n\tshared 1\n"
            "\tsnapshot-as-volume-chain 1\n"
            f"\tpvestord-chunksize {chunksize}\n\tpvestord-chunk-percentage 0.5\n"
            f"\tpvestord-initial-size {initial}\n")


def lvm(node: Node, command: str, *args: str) -> str:
    """An LVM command on ``node`` with pvestord's own ``--config``
    (:data:`pvestord.adapters.lvm.FAST_CONFIG`), so that the LVs a test makes
    and activates are handled by LVM as the daemon's own commands handle them:
    a test's activation and the daemon's refresh must not differ in how they
    scan devices or whether they wait for udev.
    """
    return node.sh("lvm", command, "--config", FAST_CONFIG, *args)


def create_thin_volume(node: Node, vg: str, vmid: int, *, size: int = 64 * MiB,
                       virtual: int = 8 * GiB) -> str:
    """A thin qcow2 LV as pvestord's volumes are, made and active on ``node``."""
    lv = vm_lv(vmid)
    lvm(node, "lvcreate", "-q", "-y", "--wipesignatures", "y", "-L", f"{size}b", "-n", lv, vg)
    path = f"/dev/{vg}/{lv}"
    node.sh("qemu-img", "create", "-q", "-f", "qcow2", path, str(virtual))
    return path


def vm_disk(vmid: int) -> Pve9Disk:
    """VM ``vmid``'s disk (the volume :func:`create_thin_volume` makes) as
    :func:`launch_vm` attaches it, as Proxmox VE 9 does for ``scsi0``: a
    throttle node ``drive-scsi0`` over the qcow2 node ``f<hash>`` over the
    host_device ``e<hash>``. The names follow from the volume alone (no
    path: the node agent launching the VM has that), so both sides of a
    migration ask for them by VMID."""
    return Pve9Disk.for_volume("", vm_volid(vmid))


def vm_lv(vmid: int) -> str:
    """The LV of VM ``vmid``'s disk, named as Proxmox names a qcow2 volume."""
    return f"vm-{vmid}-disk-0.qcow2"


def vm_volid(vmid: int) -> str:
    return f"{STOREID}:{vm_lv(vmid)}"


def file_node(vmid: int) -> str:
    """The host_device node of VM ``vmid``'s disk: its threshold, its extensions."""
    return vm_disk(vmid).file_block_node


def fmt_node(vmid: int) -> str:
    """The qcow2 node of VM ``vmid``'s disk: what a test writes and reads."""
    return vm_disk(vmid).block_node


def deferred_twice(node: Node, vmid: int, seen: int, timeout: float = 120.0) -> None:
    """Until ``node``'s pvestord has held VM ``vmid``'s extensions back twice
    (records with ``DEFERRED``) past offset ``seen`` of its log: the second
    pass began after the first had ended, so after whatever came before
    ``seen``, and saw it too."""
    def deferred() -> bool:
        text = node.log_text("pvestord")[seen:]
        return sum("DEFERRED" in line.fields for line in records(text, VMID=str(vmid))) >= 2

    wait_until(deferred, timeout, f"{node.name} deferring VM {vmid}'s extensions twice")


def launch_vm(node: Node, vmid: int, path: str, *, incoming: str | None = None,
              extra: list[str] | None = None, machine: str = "none") -> None:
    """A QEMU with Proxmox VE 9's block graph on ``node`` for the volume at
    ``path`` (:func:`vm_disk`): a device uses ``vm_disk(vmid).top_node``.

    ``incoming`` starts it as a migration target (``-incoming``); ``machine``
    ``pc`` for a guest that runs (the writer guest), else no guest at all.
    """
    if Path(path).name != vm_lv(vmid):
        raise ValueError(f"{path}: not VM {vmid}'s volume as create_thin_volume names it")
    args = list(extra or [])
    if incoming is not None:
        args += ["-incoming", incoming]
    node.logs.mkdir(parents=True, exist_ok=True)
    node.call("vm_launch", vmid=vmid, run_dir=node.run_dir, event_socket=node.event_socket,
              machine=machine,
              log_path=str(node.logs / f"qemu-{vmid}.log"), extra_args=args,
              disks=[{"path": path, "volid": vm_volid(vmid), "drive_id": "scsi0"}])


def migration_status(node: Node, vmid: int) -> str:
    """``query-migrate``'s status of the VM on ``node`` (``none`` before any)."""
    return str(node.vm(vmid, "qmp", "query-migrate").get("status", "none"))


def run_status(node: Node, vmid: int) -> str:
    """``query-status``'s run state of the VM on ``node``."""
    return str(node.vm(vmid, "qmp", "query-status")["status"])


def lv_size(node: Node, vg: str, lv: str) -> int:
    """The LV's size in LVM's metadata, read from ``node``."""
    out = node.sh("lvs", "--reportformat", "json", "--units", "b", "--nosuffix", "-o",
                  "lv_size", f"{vg}/{lv}")
    return int(json.loads(out)["report"][0]["lv"][0]["lv_size"])


_DM_SIZE = """
import pathlib, sys
want = sys.argv[1]
for dm in pathlib.Path("/sys/block").glob("dm-*"):
    if (dm / "dm" / "name").read_text().strip() == want:
        print(int((dm / "size").read_text()) * 512)
        break
else:
    sys.exit(f"no device-mapper device {want}")
"""


def device_size(node: Node, vg: str, lv: str) -> int:
    """The size ``node``'s device-mapper gives the LV (what its QEMU sees).

    Read from sysfs by the dm name, not through ``/dev/VG/LV``: that link may
    be gone (see :func:`lvm`).
    """
    name = f"{vg.replace('-', '--')}-{lv.replace('-', '--')}"
    return int(node.sh("python3", "-c", _DM_SIZE, name).strip())



def pvestord_cli(cluster: Cluster, node: Node, *args: str, timeout: float = 120.0) -> str:
    """``pvestord ARGS`` on ``node`` with the bed's queue, storage.cfg, run and lock dirs."""
    argv = [str(cluster.bin / "pvestord"), "--queue", str(cluster.pve / "extend-queue"), *args,
            "--storage-config", str(cluster.pve / "storage.cfg"), "--run-dir", node.run_dir,
            "--lock-dir", str(cluster.lock_dir), "--node", node.name]
    return node.sh(*argv, timeout=timeout)


if __name__ == "__main__":
    import sys

    sys.exit(main())
