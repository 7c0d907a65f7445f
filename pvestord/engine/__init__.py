"""The daemon: turns queue entries and reconciles into extensions.

``daemon`` owns the loops (queue, reconcile, watchdog, node report in
``nodereport``); ``passes`` supervises the passes in flight and their
deadlines; ``failures`` their backoffs and error lines. ``extender`` runs one
pass over a VM (observe through QMP, decide with :mod:`pvestord.policy`, grow
under the locks, re-arm, resume), composed of ``drive`` (the model),
``lvfigures`` (what is remembered of LVM), ``gates`` (per-VG gate and storage
lock), ``tables`` (this node's device-mapper tables), ``lvgrowth`` (one
extension) and ``settle`` (re-arm and resume). ``migration`` holds the rules
of live migration both ends follow, and what they mean for a pass
(``MigrationWatch``, a destination catching up included); ``nodereport``
publishes this node's view of each thin storage; ``configsource`` serves the
commands too, and ``extender`` the fresh look of ``pvestord drives``.
"""
