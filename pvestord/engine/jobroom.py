"""The room a stream, a commit of a backing layer or a mirror still needs in its target.

An active commit's room is its progress (:func:`pvestord.policy.room_for_jobs`,
read in the pass's QMP session). A ``block-stream``, a commit of a backing
layer and a full mirror step over every offset of the virtual disk, so their
progress says nothing about data; what they still copy is in their source's
allocation map (:func:`pvestord.policy.room_for_copy`). The map comes from
``qemu-img map`` run after the QMP session has ended: qemu-server and
pvestatd share the VM's only QMP socket, and no ``qemu-img`` runs while
pvestord holds it.

A map that cannot be read leaves the job to threshold events (a chunk at a
time behind it): logged once per change, never fatal to the pass.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from pvestord import policy
from pvestord.adapters import qemu_img
from pvestord.adapters.service import fields
from pvestord.adapters.vms import LocalVm
from pvestord.engine.oncelog import OncePerChange
from pvestord.errors import PvestordError
from pvestord.policy import ChainCopy


async def room_for_chain_copies(vm: LocalVm, copies: Iterable[tuple[ChainCopy, str]],
                                room: Mapping[str, int], *, map_timeout: float,
                                said: OncePerChange) -> dict[str, int]:
    """``room`` (by target node-name) with what each copy, given with the
    image its map is read from, can still write added to its target."""
    total = dict(room)
    for copy, image in copies:
        key = (vm.vmid, copy.target, "job-map")
        try:
            extents = await qemu_img.allocation_map(image, timeout=map_timeout,
                                                    unlocked_backings=copy.unlocked_backings)
        except PvestordError as err:
            said.say(key, logging.WARNING,
                     "VM %d: block job %s: cannot read the map of %s (%s); its target %s "
                     "is grown behind the job, by threshold events", vm.vmid, copy.job.id,
                     image, err, copy.target,
                     extra=fields(VMID=vm.vmid, JOB=copy.job.id, BLOCK_NODE=copy.target))
            continue
        said.over(key)
        total[copy.target] = total.get(copy.target, 0) + policy.room_for_copy(copy, extents)
    return total
