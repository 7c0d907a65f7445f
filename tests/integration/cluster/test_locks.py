"""pmxcfs lock semantics across the two nodes: exclusion, the 10 s timeout, stale expiry.

Both guests take ``<pve>/priv/lock/<id>`` on the shared folder through
:class:`pvestord.adapters.locks.LockDirLock` (``tests/harness/lockholder.py``), as the
daemons do; ``flock`` would not reach across the guests, ``mkdir`` does. The
last test puts a real pvestord behind a lock held by the other node.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from typing import Any

from tests.harness.daemonlog import extensions, records
from tests.harness.polling import wait_until
from tests.harness.twonode import (
    Cluster,
    MiB,
    Node,
    create_thin_volume,
    file_node,
    fmt_node,
    launch_vm,
    lv_size,
    vm_lv,
)


def holder_argv(cluster: Cluster) -> list[str]:
    """The lock holder, run by the guests' Python."""
    return [str(cluster.bin / "python"), "-m", "tests.harness.lockholder"]


def events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


class Holder:
    """A lockholder running in the background on one node."""

    def __init__(self, cluster: Cluster, node: Node, lock_id: str, *args: str) -> None:
        self.node = node
        self.lock_dir = cluster.lock_dir
        self.name = f"lockholder-{secrets.token_hex(3)}"
        node.logs.mkdir(parents=True, exist_ok=True)
        self.log = node.logs / f"{self.name}.log"
        node.call("spawn", name=self.name, log=str(self.log), argv=[
            *holder_argv(cluster), "--lock-dir", str(cluster.lock_dir), "--id", lock_id, *args])

    def events(self) -> list[str]:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return [e["event"] for e in events(text)]

    def wait(self, event: str, timeout: float = 60.0) -> None:
        """Until the holder says ``event``; fails at once, with its log, when it
        gives up on the lock first or exits without saying it."""
        def said() -> bool:
            seen = self.events()
            return event in seen or "timeout" in seen or not self.node.call(
                "alive", name=self.name)
        try:
            wait_until(said, timeout, f"{self.name}: {event}")
        except TimeoutError as err:
            raise AssertionError(f"{err}\n{self.diagnosis()}") from None
        if event not in self.events():
            raise AssertionError(f"{self.name} ended without {event!r}\n{self.diagnosis()}")

    def diagnosis(self) -> str:
        """The holder's whole log (stderr included) and the lock folder as the host sees it."""
        text = self.log.read_text(errors="replace") if self.log.exists() else "(no log)"
        lock_dir = self.lock_dir
        entries = []
        for entry in sorted(lock_dir.iterdir()) if lock_dir.exists() else []:
            with contextlib.suppress(OSError):
                st = entry.stat()
                entries.append(f"  {entry.name} ino={st.st_ino} mtime_ns={st.st_mtime_ns}")
        return (f"log of {self.name} on {self.node.name}:\n{text}\n"
                f"{lock_dir} on the host:\n" + ("\n".join(entries) or "  (empty)"))

    def kill(self) -> None:
        self.node.call("stop", name=self.name, kill=True)

    def finish(self, timeout: float = 30.0) -> int | None:
        """Wait for the holder to exit by itself and return its exit status.

        It prints "acquired" or "released" a moment before it exits; stopping
        it on that line would signal a process that was about to exit 0.
        """
        wait_until(lambda: not self.node.call("alive", name=self.name), timeout,
                   f"{self.name} exited")
        status: int | None = self.node.call("stop", name=self.name)["rc"]
        return status


def take(cluster: Cluster, node: Node, lock_id: str, *args: str) -> tuple[int, dict[str, Any],
                                                                           str]:
    """Take and release the lock in the foreground: (exit status, last event, stderr)."""
    r = node.run([*holder_argv(cluster), "--lock-dir", str(cluster.lock_dir), "--id", lock_id,
                  *args], check=False, timeout=180)
    return r.rc, events(r.stdout)[-1], r.stderr


def lock_id() -> str:
    return f"storage-t{secrets.token_hex(3)}"


def test_a_lock_held_on_one_node_excludes_the_other_until_released(cluster: Cluster) -> None:
    lid = lock_id()
    release = cluster.pve / f"release-{lid}"
    holder = Holder(cluster, cluster.a, lid, "--hold-until", str(release))
    holder.wait("acquired")
    # B gives up after cfs_lock's 10 s, naming the lock and how old it is.
    rc, last, _ = take(cluster, cluster.b, lid, "--timeout", "10")
    assert rc == 3 and last["event"] == "timeout", last
    assert last["waited"] >= 10.0
    assert lid in last["message"] and "held for" in last["message"], last["message"]
    # A waiter on B gets the lock once A releases it, not before. Its own
    # timeout is far beyond the waits below: how fast a guest under emulation
    # starts Python is not what this test is about.
    waiter = Holder(cluster, cluster.b, lid, "--timeout", "300")
    waiter.wait("refused")
    assert "acquired" not in waiter.events()
    release.touch()
    holder.wait("released")
    waiter.wait("released")
    assert waiter.events() == ["refused", "acquired", "released"]
    assert holder.finish() == 0 and waiter.finish() == 0
    wait_until(lambda: not (cluster.lock_dir / lid).exists(), 10, "lock released by B")


def test_the_lock_of_a_dead_holder_expires_and_only_then(cluster: Cluster) -> None:
    lid = lock_id()
    holder = Holder(cluster, cluster.a, lid, "--hold-until", str(cluster.pve / "never"))
    holder.wait("acquired")
    holder.kill()  # SIGKILL: the lock directory stays, as after a node crash
    assert (cluster.lock_dir / lid).is_dir()
    # Young: it is a live lock as far as anyone can tell; B must not break it.
    rc, last, _ = take(cluster, cluster.b, lid, "--timeout", "10", "--expire-after", "600")
    assert rc == 3 and last["event"] == "timeout", last
    assert (cluster.lock_dir / lid).is_dir()
    # Past the expiry (shortened from pmxcfs's 120 s to 15 s): B expires it, takes it.
    rc, last, stderr = take(cluster, cluster.b, lid, "--timeout", "60", "--expire-after", "15")
    assert rc == 0 and last["event"] == "released", (last, stderr)
    assert "expiring lock" in stderr and "holder is gone" in stderr, stderr
    assert not (cluster.lock_dir / lid).exists()


def test_pvestord_waits_for_the_storage_lock_held_by_the_other_node(daemons: Cluster) -> None:
    """A's extension waits while B holds ``storage-san``, then lands."""
    cluster, a = daemons, daemons.a
    vmid = 391
    lv = vm_lv(vmid)
    path = create_thin_volume(a, cluster.vg, vmid, size=64 * MiB)
    release = cluster.pve / f"release-{vmid}"
    launch_vm(a, vmid, path)
    try:
        wait_until(lambda: int(a.vm(vmid, "named_node", file_node(vmid))["write_threshold"])
                   == 48 * MiB, 60, "threshold armed on A")
        holder = Holder(cluster, cluster.b, "storage-san", "--hold-until", str(release),
                        "--timeout", "60")
        holder.wait("acquired")
        r = a.vm(vmid, "write_pattern", fmt_node(vmid), 0, 56 * MiB, 0x2B, check=False)
        assert r["ok"], r
        # A's pass waits cfs_lock's 10 s for the lock, gives up, keeps the entry.
        wait_until(lambda: records(a.log_text("pvestord"), VMID=str(vmid),
                                   FAILURE="lock-timeout"),
                   90, "A's pvestord timed out on the lock B holds")
        assert lv_size(a, cluster.vg, lv) == 64 * MiB
        release.touch()
        holder.wait("released")
        assert holder.finish() == 0
        wait_until(lambda: lv_size(a, cluster.vg, lv) == 96 * MiB, 120, "extended after release")
        # pvestord logs the extension once it has re-armed, after LVM shows the
        # new size: wait for the line rather than expect it already there.
        wait_until(lambda: extensions(a.log_text("pvestord"), VMID=str(vmid),
                                      BLOCK_NODE=file_node(vmid)), 60,
                   "A's pvestord logged the extension")
    finally:
        release.touch()
        a.call("vm_shutdown", vmid=vmid)
        a.run(["lvremove", "-q", "-f", f"{cluster.vg}/{lv}"], check=False)
