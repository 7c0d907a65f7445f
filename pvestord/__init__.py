"""pvestord: thin provisioning for qcow2 disks on thick, shared LVM."""

__version__ = "0.1.0"
