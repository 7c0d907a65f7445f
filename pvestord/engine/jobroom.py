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

A snapshot delete's job needs its room before it starts, which the storage
plugin grants (:mod:`pvestord.adapters.preparedjobs`); a job it did not
prepare is said here (:func:`say_unprepared_deletes`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from pvestord import policy
from pvestord.adapters import preparedjobs, qemu_img
from pvestord.adapters.service import fields
from pvestord.adapters.settings import DaemonSettings
from pvestord.adapters.vmconfig import read_config_lock
from pvestord.adapters.vms import LocalVm
from pvestord.engine.drive import Drive
from pvestord.engine.memory import OncePerChange
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


def say_unprepared_deletes(settings: DaemonSettings, vm: LocalVm, drives: Iterable[Drive],
                           room: Mapping[str, int], said: OncePerChange) -> None:
    """Warn, once per job target, of a snapshot delete's job the storage plugin
    did not prepare.

    ``room``: what the VM's jobs can still write, by target node
    (:func:`room_for_chain_copies`). Under ``lock: snapshot-delete`` each
    such target must have been grown by the plugin just before qemu-server
    started the job (:func:`pvestord.policy.prepared_for_delete`). One that
    was not means qemu-server called the storage in a way the plugin does not
    recognise (another qemu-server version than the ones it was checked
    against): the daemon still grows the target behind the job, but a job at
    disk speed can outrun that and fail the delete on ENOSPC.
    """
    found = read_config_lock(settings.reports_dir, settings.node, vm.vmid)
    if found is None or found.lock != "snapshot-delete":
        return
    for drive in drives:
        if room.get(drive.view.format_node, 0) <= 0 or drive.storage is None:
            continue
        key = (vm.vmid, drive.lv, "unprepared-delete")
        age = preparedjobs.age(settings.prepared_jobs, drive.vg, drive.lv)
        if policy.prepared_for_delete(age, found.age):
            said.over(key)
            continue
        said.say(key, logging.WARNING,
                 "VM %d: a snapshot delete's block job writes into %s/%s, which pvestord's "
                 "storage plugin did not grow before the job started: this qemu-server calls "
                 "the storage in a way the plugin does not recognise. pvestord grows the LV "
                 "behind the job, which a job at disk speed can outrun and fail on ENOSPC; "
                 "please report it with the output of 'pveversion -v'", vm.vmid, drive.vg,
                 drive.lv, extra=fields(VMID=vm.vmid, VG=drive.vg, LV=drive.lv,
                                        UNPREPARED_JOB=drive.view.format_node))
