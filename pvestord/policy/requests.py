"""What queue entries ask of a pass over a VM, and when an entry is done.

An entry names a VM, a node-name and a reason. The pass merges a VM's
entries into requests (:func:`requests_from`), looks at the drives they name
(:func:`reason_for`), and afterwards each entry leaves the queue only when
its work is done or moot (:func:`entry_fate`): a crash at any point leaves
it queued, and the next pass is idempotent.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping

from pvestord.policy.reason import Reason


def requests_from(entries: Iterable[tuple[str, Reason]]) -> dict[str, Reason]:
    """(node-name, reason) pairs merged by node-name: the strongest reason wins."""
    requests: dict[str, Reason] = {}
    for block_node, reason in entries:
        old = requests.get(block_node)
        if old is None or reason.strength > old.strength:
            requests[block_node] = reason
    return requests


def reason_for(names: Collection[str], requests: Mapping[str, Reason] | None,
               thin_nodes: Collection[str]) -> Reason | None:
    """The reason to look at the drive whose node-names are ``names``, or None
    to leave it alone this pass.

    ``requests`` None is a reconcile: every drive, to (re)arm it. A
    ``nospace`` request naming no thin drive's node (``thin_nodes``; a
    device's root node, as ``BLOCK_IO_ERROR`` reports it) applies to every
    thin drive, and so does a ``job`` request (it names a block job); any
    other reason applies only to the drive it names (a typo in ``pvestord
    extend`` must not grow every drive of the VM).
    """
    if requests is None:
        return Reason.ARM
    relevant = [reason for name, reason in requests.items()
                if name in names or (name not in thin_nodes and reason.reaches_every_drive)]
    return max(relevant, key=lambda r: r.strength) if relevant else None


class EntryFate(enum.Enum):
    """What becomes of a queue entry after a pass over its VM that ran."""

    #: Its work is done (or was nothing to do): it leaves the queue.
    DONE = "done"
    #: The VM has no node of that name: moot, it leaves the queue (said at warning).
    NO_SUCH_NODE = "no-such-node"
    #: Its work failed: it stays queued, retried after the VM's backoff.
    RETRY = "retry"


def entry_fate(block_node: str, *, known_nodes: Collection[str], drives: Collection[str],
               failed: Collection[str], reason: Reason = Reason.THRESHOLD) -> EntryFate:
    """The fate of an entry naming ``block_node`` after a pass.

    ``known_nodes``: every node-name the VM has; ``drives``: the file nodes
    of its thin drives seen; ``failed``: the file nodes whose work failed.
    An entry naming a failed drive stays. So does one naming no drive by its
    file node (a device's root node, a format node) while any drive failed:
    its work may be the failed drive's. A ``job`` entry whose job is gone
    is done: a short job often ends before its pass, and the pass has
    looked at every thin drive all the same.
    """
    if block_node not in known_nodes:
        return EntryFate.DONE if reason is Reason.JOB else EntryFate.NO_SUCH_NODE
    if block_node in failed or (block_node not in drives and failed):
        return EntryFate.RETRY
    return EntryFate.DONE


def drops_entry_of_absent_vm(origin: str | None, node: str, config_node: str | None) -> bool:
    """Whether ``node``, where the entry's VM does not run, removes the entry.

    ``origin`` is the node that queued it (qmeventd-py always says); the
    original proposal's plain ``VMID:NODE`` lines and a hand-added entry may
    have none. ``config_node`` is the node holding the VM's config (pmxcfs's
    ``nodes/<node>/qemu-server/<vmid>.conf``; None: no node does).

    An entry is this node's to drop when it queued it, and an entry without
    an origin when the VM's config is here or nowhere (the VM is gone): any
    node dropping it would take it from the node where the VM runs before
    that node's daemon saw it, and the drive would wait for a reconcile.
    """
    if origin is not None:
        return origin == node
    return config_node in (None, node)
