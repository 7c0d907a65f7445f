"""What admins and Proxmox ask of pvestord beyond the daemon's loop.

Thin volumes (``volumes``), the Proxmox storage plugin's backend (``plugin``),
where a VM can run (``ranking``) and the steps around a live migration
(``migrationhint``). Each builds on the engine and the
adapters. Where HA puts a VM is modelled apart, in the ``ha_placement``
package, which needs none of them.
"""
