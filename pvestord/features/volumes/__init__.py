"""Thin volumes: create them small, shrink stopped ones, list what shrinking gives back.

The daemon only ever grows LVs; this package is where a thin LV starts small
(:mod:`~.creation`) and where a thick or bloated one is made small again
(:mod:`~.shrinking`, whose docstring says when that is safe; :mod:`~.copies`
reduces a copy target once its copy is over). Both follow
Proxmox's own LVM plugin (pve-storage ``PVE/Storage/LVMPlugin.pm``) so the
result is a volume Proxmox can attach. :mod:`~.listing` shows every volume
and what shrinking would give back; :mod:`~.recording` records the maximum of
LVs made before it was recorded; :mod:`~.storage` and :mod:`~.running`
are what they share (the storage and its locks; whether the VM runs
anywhere). The pure rules are :mod:`pvestord.policy.volumes` and
:mod:`pvestord.policy.cluster`.
"""

from pvestord.features.volumes.copies import CopyReduced, reduce_copy_target
from pvestord.features.volumes.creation import Created, create
from pvestord.features.volumes.listing import VolumeRow, list_volumes
from pvestord.features.volumes.recording import Recorded, record_maxima
from pvestord.features.volumes.running import cluster_report, read_cluster_view, refuse_if_running
from pvestord.features.volumes.shrinking import Shrunk, shrink
from pvestord.features.volumes.storage import CLUSTER_DIR, VolumeSettings, thin_storage

__all__ = [
    "CLUSTER_DIR", "CopyReduced", "Created", "Recorded", "Shrunk", "VolumeRow", "VolumeSettings",
    "cluster_report", "create", "list_volumes", "read_cluster_view", "record_maxima",
    "reduce_copy_target", "refuse_if_running", "shrink", "thin_storage",
]
