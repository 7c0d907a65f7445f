"""The daemon: turns queue entries and reconciles into extensions.

The loops: ``daemon`` runs them (queue, reconcile, status, node report,
suspended LVs, watchdog); ``vmpass`` is one pass as the daemon runs it, and
what its outcome does to the VM's queue entries; ``passes`` supervises the
passes in flight and their deadlines; ``failures`` keeps their backoffs and
error lines; ``suspension`` finds the LVs a killed change left suspended.

One pass over a VM: ``extender`` observes through QMP, decides with
:mod:`pvestord.policy`, grows under the locks, re-arms and resumes (and
makes the fresh look of ``pvestord drives``), over ``drive`` (the model),
``binding`` (the LV QEMU writes), ``lvfigures`` (what is remembered of
LVM), ``jobroom`` (the room a block job still needs), ``tables`` (this
node's device-mapper tables), ``lvgrowth`` (one extension), ``settle``
(re-arm and resume) and ``werror`` (devices that would hand ENOSPC to the
guest). ``migration`` holds the rules of live migration both ends follow,
and what they mean for a pass and its extensions (``MigrationWatch``, a
destination catching up included).

Each piece of state that crosses modules has one owner, handed to those
that use it: ``status.Activity``, what was seen of each drive and which
drives are being extended now (status and ``pvestord drives`` show it);
``lvmchanges``, who may change a VG now (``VgGates``), which of our LVM
changes run (``LvmChanges``, read by the pass deadline) and how the last one
on each VG ended (``LvmHealth``, for the node report); ``memory``, what is
remembered per VM and said once per change (to the journal, and to Proxmox's
notifications: ``Notices``); ``migration.MigrationWatch``, how long each
renaming lock has been quiet.

Published: ``nodereport`` (this node's view of each thin storage, and the
loop that publishes it), ``status``, ``publisher`` and ``metrics`` (the live
view for ``pvestord status`` and node_exporter). ``configsource``
(storage.cfg, read again when it changes) serves the commands too.
"""
