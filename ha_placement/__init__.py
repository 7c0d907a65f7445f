"""``pvestord placement``: predict where Proxmox's HA manager puts each resource, and why.

A model of pve-ha-manager's placement (the rule checks and transforms, the
node selection of ``select_service_node``, the basic and static CRS scores,
the manager's service walk) pinned to one upstream version, so that an admin
can ask "what happens to my HA resources if node3 goes into maintenance"
without a cluster. Pure functions; the readers in :mod:`.inputs` are the only
I/O.
"""

from __future__ import annotations

#: The pve-ha-manager behaviour this package models.
HA_MANAGER_VERSION = "5.2.0"
HA_MANAGER_COMMIT = "b71218f"
MODEL = f"pve-ha-manager {HA_MANAGER_VERSION} ({HA_MANAGER_COMMIT})"
