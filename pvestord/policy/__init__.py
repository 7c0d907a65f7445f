"""The pure layer: what to do, decided from figures others observed.

Nothing here does I/O, starts a process or waits: every function takes byte
counts, names and states that the adapters read from LVM, QMP and
``qemu-img``, so each rule can be tested exhaustively with hypothesis and
shared by the daemon and the commands. The engine imports the decisions it
needs from here; the submodules group them by question:

- :mod:`~pvestord.policy.extension`: when and how far a thin drive grows;
- :mod:`~pvestord.policy.table`: this node's device-mapper table against LVM;
- :mod:`~pvestord.policy.devices`, :mod:`~pvestord.policy.resume`: which
  device is which drive, and when a paused VM may run again;
- :mod:`~pvestord.policy.volumes`, :mod:`~pvestord.policy.cluster`: thin
  volumes' names and sizes, and when pmxcfs's files prove a VM stopped;
- :mod:`~pvestord.policy.blockjobs`: the room a block job's target gets,
  and when a job paused on ENOSPC may run again;
- :mod:`~pvestord.policy.requests`: which drives a queue entry asks a pass
  to look at, and when the entry leaves the queue;
- :mod:`~pvestord.policy.storageoptions`: the values of our storage options;
- :mod:`~pvestord.policy.proxmox`: Proxmox's identifiers (VMID, storage id,
  VG and LV names, pidfile, node name), each rule written once;
- :mod:`~pvestord.policy.reason`, :mod:`~pvestord.policy.sizes`: the
  vocabulary (why a drive was queued, byte sizes).
"""

from pvestord.policy.blockjobs import (
    EVERY_LAYER,
    BlockJob,
    ChainCopy,
    Extent,
    JobEdges,
    chain_copy,
    counts_data,
    data_left_to_copy,
    job_target_size,
    jobs_to_resume,
    needs_job_graph,
    prepared_for_delete,
    room_for_copy,
    room_for_jobs,
    room_made_since_resume,
    writes_drives,
)
from pvestord.policy.devices import (
    BlockDevice,
    DriveIdentity,
    device_filenames,
    device_on,
    hands_enospc_to_guest,
    qom_path,
)
from pvestord.policy.extension import (
    Arm,
    AtMaximum,
    Decision,
    DriveState,
    Extend,
    ExtendPastMaximum,
    ExtensionState,
    Nothing,
    NotThin,
    classify,
    decide,
    enospc_is_new,
    exceeded,
    extend_target,
    maximum_size,
    may_pass_maximum,
    near_its_end,
    paused_out_of_room,
    threshold,
    wanted_headroom,
)
from pvestord.policy.reason import Reason
from pvestord.policy.requests import EntryFate, entry_fate, reason_for, requests_from
from pvestord.policy.resume import (
    MAX_ROUNDS,
    BlockedBecause,
    ResumeBlocker,
    ResumeDecision,
    another_round,
    may_resume,
    needing_more,
    resume_blocker,
)
from pvestord.policy.table import TableState, table_state

__all__ = [
    "EVERY_LAYER",
    "MAX_ROUNDS",
    "Arm",
    "AtMaximum",
    "BlockDevice",
    "BlockJob",
    "BlockedBecause",
    "ChainCopy",
    "Decision",
    "DriveIdentity",
    "DriveState",
    "EntryFate",
    "Extend",
    "ExtendPastMaximum",
    "ExtensionState",
    "Extent",
    "JobEdges",
    "NotThin",
    "Nothing",
    "Reason",
    "ResumeBlocker",
    "ResumeDecision",
    "TableState",
    "another_round",
    "chain_copy",
    "classify",
    "counts_data",
    "data_left_to_copy",
    "decide",
    "device_filenames",
    "device_on",
    "enospc_is_new",
    "entry_fate",
    "exceeded",
    "extend_target",
    "hands_enospc_to_guest",
    "job_target_size",
    "jobs_to_resume",
    "maximum_size",
    "may_pass_maximum",
    "may_resume",
    "near_its_end",
    "needing_more",
    "needs_job_graph",
    "paused_out_of_room",
    "prepared_for_delete",
    "qom_path",
    "reason_for",
    "requests_from",
    "resume_blocker",
    "room_for_copy",
    "room_for_jobs",
    "room_made_since_resume",
    "table_state",
    "threshold",
    "wanted_headroom",
    "writes_drives",
]
