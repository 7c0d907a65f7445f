"""What admins and Proxmox ask of pvestord beyond the daemon's loop.

Thin volumes (``volumes``) and the Proxmox storage plugin's backend
(``plugin``), where a VM can run (``ranking``) and where HA puts it
(``placement``). Each builds on the engine and the adapters.
"""
