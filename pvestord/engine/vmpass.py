"""One pass over a VM as the daemon runs it: the extender's pass, then what
its outcome means for the VM's queue entries and its backoff.

An entry leaves the queue only when its pass succeeded, or when it is known
to be moot (the VM stopped, the node-name does not exist;
:func:`pvestord.policy.entry_fate`); a failed one stays queued and is retried
after the VM's backoff (:mod:`~pvestord.engine.failures`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from pvestord import policy
from pvestord.adapters.qmp import VmGoneError
from pvestord.adapters.queue import Entry, ExtendQueue
from pvestord.adapters.service import fields
from pvestord.adapters.vms import LocalVm, local_vm
from pvestord.engine.drive import VmOutcome
from pvestord.engine.extender import Extender
from pvestord.engine.failures import Failures
from pvestord.errors import PassDeferred, PvestordError
from pvestord.policy import EntryFate

log = logging.getLogger(__name__)


async def run_pass(vm: LocalVm, entries: list[Entry], *, extender: Extender,
                   queue: ExtendQueue, failures: Failures, run_dir: Path) -> None:
    """Pass over ``vm`` for its ``entries`` (none: a reconcile); note what
    failed or works again, and drop the entries whose work is done or moot."""
    requests = (policy.requests_from((e.block_node, e.reason) for e in entries)
                if entries else None)
    try:
        await extender.live.resume_if_left_paused(vm)
        outcome = await extender.handle(vm, requests)
        if not entries and not outcome.errors:
            # A reconcile: the moment to make a finished mirror's target thin.
            await extender.live.reduce_all(vm)
    except VmGoneError as err:
        if local_vm(run_dir, vm.vmid) is None:
            if entries:
                await queue.complete_async(entries)
                log.info("VM %d stopped: %d entr%s dropped", vm.vmid, len(entries),
                         "y" if len(entries) == 1 else "ies",
                         extra=fields(VMID=vm.vmid, ENTRY="dropped"))
            return
        # The pidfile is written before the QMP socket exists: a VM that
        # is starting up looks like this for a moment.
        failures.note_error((vm.vmid, ""), err, level=logging.WARNING)
        failures.backoff(vm.vmid)
        return
    except PassDeferred as err:
        failures.busy_backoff(vm.vmid, err)
        return
    except PvestordError as err:
        failures.note_error((vm.vmid, ""), err)
        failures.backoff(vm.vmid)
        return
    failures.not_busy(vm.vmid)
    failures.clear_error((vm.vmid, ""), f"VM {vm.vmid}: QMP works again")
    await complete_entries(queue, failures, vm, entries, outcome)


async def complete_entries(queue: ExtendQueue, failures: Failures, vm: LocalVm,
                           entries: list[Entry], outcome: VmOutcome) -> None:
    """Say what failed or works again; drop the entries whose work is done or moot."""
    done: list[Entry] = []
    for node, err in outcome.errors.items():
        failures.note_error((vm.vmid, node), err)
    for node in outcome.drives - set(outcome.errors):
        failures.clear_error((vm.vmid, node), f"VM {vm.vmid} {node}: extensions work again")
    for entry in entries:
        fate = policy.entry_fate(entry.block_node, known_nodes=outcome.known_nodes,
                                 drives=outcome.drives, failed=outcome.errors.keys(),
                                 reason=entry.reason)
        if fate is EntryFate.NO_SUCH_NODE:
            log.warning("VM %d has no block node %r: entry dropped", vm.vmid,
                        entry.block_node,
                        extra=fields(VMID=vm.vmid, BLOCK_NODE=entry.block_node,
                                     ENTRY="dropped"))
        if fate is not EntryFate.RETRY:
            done.append(entry)  # a failed one stays queued, retried after the backoff
    if outcome.errors:
        failures.backoff(vm.vmid)
    else:
        failures.succeeded(vm.vmid)
    if done:
        await queue.complete_async(done)
