"""The agent that runs inside each guest of the two-node bed (:mod:`tests.harness.twonode`).

The host drives both nodes during one test (start QEMU on A, migrate it to B,
look at B...), so each guest runs this agent on the folder shared with the
host (9p, no caching: what one side writes the other sees at once; no inotify
across it, hence polling). A request is a JSON file the host renames into
``<dir>/req/``; the agent claims it by renaming it into ``<dir>/work/`` and
answers with ``<dir>/res/<id>.json``, written to a temporary name and renamed
so the host never reads half a reply. Each request runs in its own thread, so
a long one (a migration, a paced writer) does not hold up the others.

Requests (``op`` and its fields):

* ``run``: ``argv``, ``cmd_timeout`` -> ``rc``, ``stdout``, ``stderr``, ``duration``;
* ``spawn`` / ``stop``: a long-lived process (a daemon) by ``name``, its output in ``log``,
  run as :class:`tests.harness.daemons.Daemon` runs it (with ``NOTIFY_SOCKET``);
  ``ready`` waits for its ``READY=1``; ``stop`` sends SIGTERM (SIGKILL with
  ``kill``) and returns its exit status;
* ``vm_launch`` / ``vm`` / ``vm_shutdown``: a :class:`tests.harness.qemu.QemuVM`
  kept here by VMID; ``vm`` calls one of its methods with JSON arguments;
* ``quit``: the agent exits and the guest powers off.

An exception in a request becomes ``{"error": ..., "message": ...}`` in the
reply; the host raises it there. This is test code: threads are fine here.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.harness.daemons import Daemon
from tests.harness.qemu import Pve9Disk, QemuVM

#: How often the request folder is looked at (9p reports no changes).
POLL = 0.05


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


class Agent:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        for sub in ("req", "work", "res"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, Daemon] = {}
        self.vms: dict[int, QemuVM] = {}
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.ops: dict[str, Callable[[dict[str, Any]], Any]] = {
            "ping": lambda r: {"node": os.uname().nodename, "pid": os.getpid()},
            "run": self.op_run, "spawn": self.op_spawn, "stop": self.op_stop,
            "alive": self.op_alive, "ready": self.op_ready,
            "vm_launch": self.op_vm_launch, "vm": self.op_vm,
            "vm_shutdown": self.op_vm_shutdown, "quit": self.op_quit,
        }

    # -- ops

    def op_run(self, req: dict[str, Any]) -> dict[str, Any]:
        started = time.monotonic()
        try:
            proc = subprocess.run(  # noqa: S603 - argument list
                req["argv"], capture_output=True, text=True, timeout=req.get("cmd_timeout", 120),
                stdin=subprocess.DEVNULL, check=False, env={**os.environ, **req.get("env", {})})
        except subprocess.TimeoutExpired as err:
            return {"rc": -9, "stdout": str(err.stdout or ""), "stderr": f"timed out: {err}",
                    "duration": time.monotonic() - started}
        return {"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr,
                "duration": time.monotonic() - started}

    def op_spawn(self, req: dict[str, Any]) -> dict[str, Any]:
        name = req["name"]
        with self.lock:
            if name in self.procs and self.procs[name].proc.poll() is None:
                raise RuntimeError(f"process {name} already runs")
        daemon = Daemon(name, req["argv"], Path(req["log"]), env=req.get("env", {}))
        with self.lock:
            self.procs[name] = daemon
        return {"pid": daemon.proc.pid}

    def op_stop(self, req: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            daemon = self.procs.pop(req["name"])
        if req.get("kill"):
            daemon.kill()
            return {"rc": daemon.proc.returncode, "hung": False}
        try:
            return {"rc": daemon.stop(), "hung": False}
        except RuntimeError:  # deaf to SIGTERM: killed (daemons.STOP_TIMEOUT)
            return {"rc": None, "hung": True}

    def op_alive(self, req: dict[str, Any]) -> bool:
        with self.lock:
            daemon = self.procs.get(req["name"])
        return daemon is not None and daemon.proc.poll() is None

    def op_ready(self, req: dict[str, Any]) -> bool:
        """Until the process notifies ``READY=1``; an error if it exits first."""
        with self.lock:
            daemon = self.procs[req["name"]]
        daemon.wait_ready(req.get("wait"))
        return True

    def op_vm_launch(self, req: dict[str, Any]) -> dict[str, Any]:
        disks = [Pve9Disk.for_volume(d["path"], d["volid"], d["drive_id"])
                 for d in req["disks"]]
        vm = QemuVM(req["vmid"], req["run_dir"], disks=disks,
                    machine=req.get("machine", "none"), event_socket=req.get("event_socket"),
                    extra_args=req.get("extra_args", []), log_path=req.get("log_path"))
        vm.launch()
        with self.lock:
            self.vms[req["vmid"]] = vm
        return {"pid": vm.pid}

    def op_vm(self, req: dict[str, Any]) -> Any:
        with self.lock:
            vm = self.vms[req["vmid"]]
        method = req["method"]
        if method.startswith("_"):
            raise ValueError(f"no such VM method {method!r}")
        return getattr(vm, method)(*req.get("args", []), **req.get("kwargs", {}))

    def op_vm_shutdown(self, req: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            vm = self.vms.pop(req["vmid"], None)
        if vm is None:
            return {"rc": None}
        vm.shutdown()
        return {"rc": vm.returncode}

    def op_quit(self, req: dict[str, Any]) -> None:
        self.done.set()

    # -- loop

    def handle(self, work: Path) -> None:
        rid = work.stem
        try:
            req = json.loads(work.read_text())
            reply = {"result": _jsonable(self.ops[req["op"]](req))}
        except Exception as err:  # every failure goes back to the host
            reply = {"error": type(err).__name__, "message": str(err),
                     "traceback": traceback.format_exc()}
        tmp = self.folder / "res" / f".{rid}.tmp"
        tmp.write_text(json.dumps(reply))
        tmp.rename(self.folder / "res" / f"{rid}.json")
        work.unlink(missing_ok=True)

    def serve(self) -> None:
        (self.folder / "ready").write_text(f"{os.getpid()}\n")
        while not self.done.is_set():
            for path in sorted((self.folder / "req").glob("*.json")):
                claimed = self.folder / "work" / path.name
                try:
                    path.rename(claimed)
                except FileNotFoundError:
                    continue
                threading.Thread(target=self.handle, args=(claimed,), daemon=True,
                                 name=f"req-{path.stem}").start()
            time.sleep(POLL)
        self.cleanup()

    def cleanup(self) -> None:
        for vm in list(self.vms.values()):
            vm.shutdown()
        for daemon in list(self.procs.values()):
            with contextlib.suppress(RuntimeError):  # a hung one is killed
                daemon.stop()


def setup_link(mac: str, address: str) -> str:
    """Bring up the private migration link: the NIC with ``mac``, at ``address``."""
    for dev in Path("/sys/class/net").iterdir():
        if (dev / "address").read_text().strip().lower() == mac.lower():
            for argv in (["ip", "addr", "add", address, "dev", dev.name],
                         ["ip", "link", "set", dev.name, "up"],
                         ["ip", "link", "set", "lo", "up"]):
                subprocess.run(argv, check=True, timeout=30)  # noqa: S603
            return dev.name
    raise RuntimeError(f"no network interface with MAC {mac}")


def main() -> int:
    parser = argparse.ArgumentParser(prog="nodeagent")
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--mac", required=True)
    parser.add_argument("--addr", required=True)
    args = parser.parse_args()
    setup_link(args.mac, args.addr)
    Path("/srv/pvestord-test/run").mkdir(parents=True, exist_ok=True)
    Agent(args.dir).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
