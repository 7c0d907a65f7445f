"""A VM's QMP socket, for one short batch of commands at a time.

qemu-server uses the same socket (``/var/run/qemu-server/<vmid>.qmp``), and QEMU
serves one client on it at a time: pvestord connects, runs its batch and
disconnects, and never holds it. Every call has a budget (:data:`CALL_TIMEOUT`);
a QEMU that accepts and never answers costs one budget, then an error.

What this module knows about QEMU's block layer:

- A thin drive is a ``host_device`` *file* node on an LV, under a writable
  ``qcow2`` *format* node. The format node's ``file`` field is its child's
  filename, which is how the two are paired (QMP offers no stable graph query).
- The write threshold lives on the file node (physical offsets), and so does
  ``wr_highest_offset``: the allocation the policy needs.
- ``BLOCK_IO_ERROR`` names the device's root node, not the node that failed,
  so a ``nospace`` entry is resolved by looking at the VM's devices.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from qemu.qmp import ExecuteError, QMPClient, QMPError
from qemu.qmp.qmp_client import GreetingError

from pvestord.adapters import tally
from pvestord.errors import PassDeferred, PvestordError
from pvestord.policy import (
    BlockDevice,
    BlockJob,
    DriveIdentity,
    JobEdges,
    device_filenames,
    device_on,
    qom_path,
)
from pvestord.policy.devices import own_filename
from pvestord.policy.vmconfig import nbd_node

log = logging.getLogger(__name__)

#: Default budget for connecting (greeting + capabilities) and for each
#: command; the daemon passes its own (``--qmp-timeout``).
#: ``query-named-block-nodes`` takes ~40 ms under emulation; a QEMU busy with a
#: long HMP command on another monitor delays ours (one main loop serves all).
CONNECT_TIMEOUT = 10.0
CALL_TIMEOUT = 10.0
#: Connections tried when QEMU sends an event before its greeting (see
#: :meth:`VmMonitor.__aenter__`): the race needs one more, never many.
GREETING_ATTEMPTS = 2


class QmpError(PvestordError):
    """A QMP conversation with a VM failed."""


class VmGoneError(QmpError):
    """The VM's QMP socket is missing or refuses connections: the VM is not running."""


class VmBusyError(PassDeferred):
    """The VM is in a migration state in which its block nodes are not ours to touch."""


#: Run states in which a pass leaves the VM alone: an incoming migration's
#: nodes are inactive (and lose any threshold when it completes), and a
#: source that finished migrating no longer owns its disks.
MIGRATION_STATES = frozenset({"inmigrate", "finish-migrate", "postmigrate"})


class QmpTimeout(QmpError):
    """QEMU did not answer within the budget."""


@dataclass(frozen=True)
class ThinDriveView:
    """What QEMU says of one candidate thin drive."""

    file_node: str
    format_node: str
    path: str
    virtual_size: int
    allocation: int
    threshold: int
    #: The qcow2 node's ``image`` (QEMU's ImageInfo, the same shape as
    #: ``qemu-img info --output=json``): cluster size, extended L2, bitmaps.
    image: Mapping[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class BlockNodes:
    """What one ``query-named-block-nodes`` (and its blockstats) tells of a VM."""

    #: The candidate thin drives, with their figures.
    drives: list[ThinDriveView]
    #: Every node-name the VM has (to tell a stale queue entry).
    names: set[str]
    #: The image each named node opens (:func:`filenames_from`): what
    #: ``qemu-img`` is pointed at to read a layer's allocation map.
    filenames: dict[str, str]
    #: The nodes that are NBD clients (:func:`pvestord.policy.vmconfig.nbd_node`):
    #: a live migration's mirror targets.
    nbd: frozenset[str] = frozenset()


@dataclass(frozen=True)
class RunState:
    running: bool
    status: str
    #: Devices whose io-status is ``nospace``.
    nospace_devices: tuple[BlockDevice, ...]
    #: Devices whose io-status is ``failed``: a real I/O error, never resumed by us.
    failed_devices: tuple[BlockDevice, ...]
    #: The VM's block jobs (``query-block-jobs``): one paused on ENOSPC is
    #: resumed once its thin drives have room (:func:`pvestord.policy.jobs_to_resume`).
    jobs: tuple[BlockJob, ...] = ()

    def nospace_on(self, path: str, block_nodes: Collection[str] = ()) -> bool:
        """Whether the VM is paused on ENOSPC on a device that sits on the
        drive at ``path`` with ``block_nodes`` (matched exactly).

        Only while it is paused: QEMU 7.2 keeps a ``-blockdev`` device's
        io-status at ``nospace`` after ``cont``, so a running VM would look
        paused forever (and be extended on every pass). A pause no device
        owns (:attr:`paused_on_unowned_error`) is on no path here: which
        drive it counts for is :func:`pvestord.policy.paused_out_of_room`'s rule.
        """
        drive = DriveIdentity(path, frozenset(block_nodes))
        return self.paused_on_nospace and any(device_on(d, drive) for d in self.nospace_devices)

    @property
    def paused_on_nospace(self) -> bool:
        return (not self.running and self.status == "io-error" and bool(self.nospace_devices)
                and not self.failed_devices)

    @property
    def paused_on_unowned_error(self) -> bool:
        """Paused on an I/O error that no device owns up to.

        The state a live migration brings: QEMU migrates the run state
        (``io-error``) and the guest's failed requests, but not the devices'
        io-status. A guest that filled its LV while its source deferred the
        extension arrives like this on the destination. Which thin drives
        count as paused on ENOSPC then is :func:`pvestord.policy.paused_out_of_room`'s
        rule; a real I/O error fails again after ``cont`` and then shows as
        ``failed``, which we never resume.
        """
        return (not self.running and self.status == "io-error" and not self.nospace_devices
                and not self.failed_devices)

    @property
    def paused_for_room(self) -> bool:
        """Paused in a way that more room on our thin drives may resolve."""
        return self.paused_on_nospace or self.paused_on_unowned_error

    @property
    def jobs_paused_for_room(self) -> bool:
        """A block job of the VM is paused on ENOSPC (the guest may run on)."""
        return any(job.paused_for_room for job in self.jobs)


class VmMonitor:
    """One connection to a VM's QMP socket; use as ``async with VmMonitor(path, name):``."""

    def __init__(self, socket_path: Path, name: str, *, timeout: float = CALL_TIMEOUT) -> None:
        self.socket_path = socket_path
        self.name = name
        #: Budget for the greeting and for each command (a QEMU that accepts
        #: and never answers must not hold a pass, or the storage lock, for long).
        self.timeout = timeout
        self._client = QMPClient(name)

    async def __aenter__(self) -> Self:
        if not self.socket_path.exists():
            raise VmGoneError(f"{self.name}: no QMP socket at {self.socket_path}")
        for attempt in range(1, GREETING_ATTEMPTS + 1):
            try:
                await self._connect()
                return self
            except QmpError as err:
                if not isinstance(getattr(err.__cause__, "exc", None), GreetingError) \
                        or attempt == GREETING_ATTEMPTS:
                    raise
                # QEMU resets its monitor to capabilities negotiation only when
                # the I/O thread handles the new connection; an event emitted
                # from the main loop just before (a RESUME after another
                # client's cont) can come first. The next connection is clean.
                log.debug("%s: an event came before the QMP greeting: connecting again",
                          self.name)
                self._client = QMPClient(self.name)
        raise AssertionError("unreachable")

    async def _connect(self) -> None:
        tally.happened("qmp_session")
        try:
            async with asyncio.timeout(self.timeout):
                await self._client.connect(str(self.socket_path))
        except TimeoutError:
            await self._disconnect()
            raise QmpTimeout(
                f"{self.name}: QMP socket {self.socket_path} did not greet within "
                f"{self.timeout:g} s") from None
        except (QMPError, OSError) as err:
            await self._disconnect()
            cause = getattr(err, "exc", err)
            if isinstance(cause, ConnectionRefusedError | FileNotFoundError):
                raise VmGoneError(f"{self.name}: QMP socket refuses connections") from err
            raise QmpError(f"{self.name}: cannot connect to {self.socket_path}: {err}") from err

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self._disconnect()

    async def _disconnect(self) -> None:
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                await self._client.disconnect()
        except Exception as err:  # closing must not fail a finished batch
            # qemu.qmp re-raises its reader's EOFError here when QEMU went away.
            log.debug("%s: disconnect: %r", self.name, err)

    async def execute(self, command: str, arguments: Mapping[str, object] | None = None) -> Any:
        """Run one command; QEMU's error becomes a :class:`QmpError` with its text."""
        try:
            async with asyncio.timeout(self.timeout):
                return await self._client.execute(
                    command, dict(arguments) if arguments else None)
        except TimeoutError:
            raise QmpTimeout(f"{self.name}: {command} got no answer within "
                             f"{self.timeout:g} s") from None
        except ExecuteError as err:
            raise QmpError(f"{self.name}: {command}: {err.error.error.desc}") from err
        except (QMPError, EOFError, OSError) as err:
            raise QmpError(f"{self.name}: {command}: {err!r}") from err

    async def execute_optional(self, command: str,
                               arguments: Mapping[str, object] | None = None) -> Any:
        """:meth:`execute` for what a QEMU may lack (a property, a debug
        command): its refusal is None, logged at debug. A timeout is still an
        error: a QEMU that does not answer must not look like one that said no."""
        try:
            return await self.execute(command, arguments)
        except QmpTimeout:
            raise
        except QmpError as err:
            log.debug("%s: %s", self.name, err)
            return None

    async def block_nodes(self) -> BlockNodes:
        """Every ``host_device`` file node under a writable qcow2 node, with its
        figures; every node-name the VM has; and each node's image file."""
        nodes = await self.execute("query-named-block-nodes", {"flat": True})
        stats = await self.execute("query-blockstats", {"query-nodes": True})
        names = {n["node-name"] for n in nodes if isinstance(n, dict)
                 and isinstance(n.get("node-name"), str)} if isinstance(nodes, list) else set()
        return BlockNodes(thin_drives_from(nodes, stats), names, filenames_from(nodes),
                          nbd_nodes_from(nodes))

    async def set_threshold(self, file_node: str, offset: int) -> None:
        """Arm (``offset`` > 0) or disarm (0) the one-shot write threshold."""
        await self.execute("block-set-write-threshold",
                           {"node-name": file_node, "write-threshold": offset})

    async def run_state(self) -> RunState:
        status = await self.execute("query-status")
        block = await self.execute("query-block")
        jobs = await self.execute("query-block-jobs")
        return run_state_from(status, block, jobs)

    async def block_jobs(self) -> tuple[BlockJob, ...]:
        """``query-block-jobs`` alone: the jobs' progress as it is now."""
        return block_jobs_from(await self.execute("query-block-jobs"))

    async def job_graph(self) -> dict[str, JobEdges]:
        """Each block job's edges in QEMU's job graph (:func:`job_graph_from`),
        by job id; empty when this QEMU has no ``x-debug-query-block-graph``
        (a debug command: the targets are then kept ahead by threshold events
        alone)."""
        return job_graph_from(await self.execute_optional("x-debug-query-block-graph"))

    async def block_exports(self) -> int:
        """How many block exports (an NBD server's) the VM has; ``query-block-exports``."""
        reply = await self.execute("query-block-exports")
        return len(reply) if isinstance(reply, list) else 0

    async def stop(self) -> None:
        """Pause the VM (``stop``): QEMU drains and flushes every drive first."""
        await self.execute("stop")

    async def cont(self) -> None:
        await self.execute("cont")

    async def resume_job(self, job: str) -> None:
        """Resume a block job paused on an error (``block-job-resume``)."""
        await self.execute("block-job-resume", {"device": job})

    async def block_devices(self) -> list[BlockDevice]:
        """Every device of ``query-block`` with a medium."""
        block = await self.execute("query-block")
        return [block_device_from(d) for d in block
                if isinstance(d, dict) and isinstance(d.get("inserted"), dict)] \
            if isinstance(block, list) else []

    async def write_error_action(self, device: BlockDevice) -> str | None:
        """The device's ``werror`` property (``qom-get``); None when QEMU has
        none to give (a device without one, an older QEMU)."""
        value = await self.execute_optional("qom-get", {"path": qom_path(device),
                                                         "property": "werror"})
        return value if isinstance(value, str) else None


def thin_drives_from(nodes: object, stats: object) -> list[ThinDriveView]:
    """Pair file and format nodes from QMP replies; pure, so it is fuzzed in the unit tests.

    Malformed entries (missing or wrong-typed fields) are skipped, never fatal:
    a QEMU of another version must not stop the daemon.
    """
    if not isinstance(nodes, list):
        return []
    allocation: dict[str, int] = {}
    if isinstance(stats, list):
        for entry in stats:
            if not isinstance(entry, dict):
                continue
            name = entry.get("node-name")
            offset = _get_size(entry.get("stats"), "wr_highest_offset")
            if isinstance(name, str) and offset is not None:
                allocation[name] = offset
    files: dict[str, dict[str, Any]] = {}
    formats: list[dict[str, Any]] = []
    for node in nodes:
        if not isinstance(node, dict) or not isinstance(node.get("node-name"), str):
            continue
        if node.get("drv") == "host_device" and isinstance(node.get("file"), str):
            files[node["file"]] = node
        elif node.get("drv") == "qcow2" and node.get("ro") is False:
            formats.append(node)
    drives: list[ThinDriveView] = []
    for fmt in formats:
        path = own_filename(fmt.get("file"))
        child = files.get(path) if path is not None else None
        if child is None or child.get("ro") is not False:
            continue
        virtual_size = _get_size(fmt.get("image"), "virtual-size")
        # A host_device without a size of its own is no device we can extend.
        device_size = _get_size(child.get("image"), "virtual-size")
        if virtual_size is None or device_size is None or not isinstance(path, str):
            continue
        threshold = _get_size(child, "write_threshold")
        drives.append(ThinDriveView(
            file_node=child["node-name"], format_node=fmt["node-name"], path=path,
            virtual_size=virtual_size, allocation=allocation.get(child["node-name"], 0),
            threshold=0 if threshold is None else threshold,
            image=fmt["image"],
        ))
    return drives


def run_state_from(status: object, block: object, jobs: object = ()) -> RunState:
    running = isinstance(status, dict) and status.get("running") is True
    state = status.get("status") if isinstance(status, dict) else None
    nospace: list[BlockDevice] = []
    failed: list[BlockDevice] = []
    if isinstance(block, list):
        for device in block:
            if not isinstance(device, dict):
                continue
            io_status = device.get("io-status")
            if io_status == "nospace":
                nospace.append(block_device_from(device))
            elif io_status == "failed":
                failed.append(block_device_from(device))
    return RunState(running, state if isinstance(state, str) else "unknown",
                    tuple(nospace), tuple(failed), block_jobs_from(jobs))


def block_jobs_from(reply: object) -> tuple[BlockJob, ...]:
    """The jobs of a ``query-block-jobs`` reply; an entry with a field of the
    wrong type is skipped (a QEMU of another version must not stop a pass)."""
    if not isinstance(reply, list):
        return ()
    jobs = []
    for job in reply:
        if not isinstance(job, dict):
            continue
        fields_ = (job.get("device"), job.get("type"), job.get("status"), job.get("io-status"))
        paused = job.get("paused")
        if all(isinstance(f, str) for f in fields_) and isinstance(paused, bool):
            job_id, kind, status, io_status = (str(f) for f in fields_)
            # Progress is optional: a job without it has no room to give.
            jobs.append(BlockJob(job_id, kind, status, paused, io_status,
                                 length=_get_size(job, "len") or 0,
                                 offset=_get_size(job, "offset") or 0))
    return tuple(jobs)


def filenames_from(nodes: object) -> dict[str, str]:
    """The image each node of a ``query-named-block-nodes`` reply opens, by
    node-name (:func:`~pvestord.policy.devices.own_filename`: a node given
    its backing at run time names its own file inside a ``json:`` name)."""
    found: dict[str, str] = {}
    for node in nodes if isinstance(nodes, list) else ():
        if isinstance(node, dict) and isinstance(node.get("node-name"), str):
            path = own_filename(node.get("file"))
            if path is not None:
                found[node["node-name"]] = path
    return found


def nbd_nodes_from(nodes: object) -> frozenset[str]:
    """The node-names of a ``query-named-block-nodes`` reply that are NBD
    clients (:func:`pvestord.policy.vmconfig.nbd_node`); junk is skipped."""
    return frozenset(node["node-name"] for node in (nodes if isinstance(nodes, list) else ())
                     if isinstance(node, dict) and isinstance(node.get("node-name"), str)
                     and nbd_node(node.get("drv"), node.get("file")))


def job_graph_from(graph: object) -> dict[str, JobEdges]:
    """Each block job's edges (:class:`~pvestord.policy.JobEdges`), by job
    id, from an ``x-debug-query-block-graph`` reply. Junk is skipped: it is a
    debug interface, and a QEMU whose graph differs must not stop a pass."""
    if not isinstance(graph, dict):
        return {}
    nodes, edges = graph.get("nodes"), graph.get("edges")
    if not isinstance(nodes, list) or not isinstance(edges, list):
        return {}
    jobs: dict[int, str] = {}
    block_nodes: dict[int, str] = {}
    for node in nodes:
        if not (isinstance(node, dict) and isinstance(node.get("name"), str)
                and isinstance(node.get("id"), int)):
            continue
        if node.get("type") == "block-job":
            jobs[node["id"]] = node["name"]
        elif node.get("type") == "block-driver":
            block_nodes[node["id"]] = node["name"]
    named: dict[str, dict[str, str]] = {}
    intermediates: dict[str, list[str]] = {}
    children: dict[str, set[str]] = {}
    for edge in edges:
        if not isinstance(edge, dict) or not isinstance(edge.get("name"), str):
            continue
        parent_id, child_id = edge.get("parent"), edge.get("child")
        if not isinstance(parent_id, int) or not isinstance(child_id, int):
            continue
        child = block_nodes.get(child_id)
        if child is None:
            continue
        name = edge["name"]
        job = jobs.get(parent_id)
        if job is not None:
            if name == "intermediate node":
                intermediates.setdefault(job, []).append(child)
            else:
                named.setdefault(job, {})[name] = child
        elif parent_id in block_nodes and name in ("backing", "file"):
            children.setdefault(block_nodes[parent_id], set()).add(child)
    return {job: JobEdges(target=named.get(job, {}).get("target"),
                          source=named.get(job, {}).get("source"),
                          active=named.get(job, {}).get("active node"),
                          base=named.get(job, {}).get("base"),
                          intermediates=top_first(intermediates.get(job, []), children))
            for job in set(named) | set(intermediates)}


def top_first(layers: list[str], children: Mapping[str, set[str]]) -> tuple[str, ...]:
    """``layers`` of one chain ordered from the top down: a layer is above
    every layer it reaches through ``backing`` and ``file`` edges (a filter
    such as a commit's own may sit between two of them)."""
    def below(layer: str) -> set[str]:
        seen: set[str] = set()
        todo = [layer]
        while todo:
            for child in children.get(todo.pop(), ()):
                if child not in seen:
                    seen.add(child)
                    todo.append(child)
        return seen

    wanted = set(layers)
    return tuple(sorted(layers, key=lambda layer: (-len(below(layer) & wanted), layer)))


def block_device_from(device: Mapping[str, Any]) -> BlockDevice:
    """One ``query-block`` entry as a :class:`BlockDevice`; junk fields become empty."""
    inserted = device.get("inserted")
    inserted = inserted if isinstance(inserted, dict) else {}
    name = next((n for n in (device.get("device"), device.get("qdev"))
                 if isinstance(n, str) and n), "?")
    block_node = inserted.get("node-name")
    return BlockDevice(name, block_node if isinstance(block_node, str) else None,
                       device_filenames(inserted.get("file")))


def migration_status_from(reply: object) -> str | None:
    """The ``status`` of a ``query-migrate`` reply; None before any migration or
    when the reply has no usable one (a list there must not reach a set lookup)."""
    status = reply.get("status") if isinstance(reply, dict) else None
    return status if isinstance(status, str) else None


def _get_size(mapping: object, key: str) -> int | None:
    # QEMU's sizes and offsets are unsigned: a negative one (or a bool, which
    # is an int to Python) is junk, and the policy refuses negative figures.
    if not isinstance(mapping, dict):
        return None
    value = mapping.get(key)
    return value if type(value) is int and value >= 0 else None
