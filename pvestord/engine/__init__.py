"""The daemon: turns queue entries and reconciles into extensions.

``daemon`` owns the loops (queue, reconcile, watchdog, node report);
``extender`` runs one pass over a VM (observe through QMP, decide with
:mod:`pvestord.policy`, grow under the locks, re-arm, resume); ``migration``
holds the rules of live migration both ends follow; ``nodereport`` publishes
this node's view of each thin storage.
"""
