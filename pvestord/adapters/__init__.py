"""The edges: every conversation with the world outside the process.

LVM (``lvm``, the persistent ``lvmshell``), QEMU (``qmp``), ``qemu-img``,
pmxcfs and local locks (``locks``), the cluster extend queue's file
(``queue``), ``storage.cfg`` and the daemon's settings (``config``), this
node's QEMU processes (``vms``), inotify (``watch``), systemd and the journal
(``service``), the VG health marks under ``/run`` (``vghealth``), and the one
way to run a command (``command``). Each turns a process, socket or file into
typed values and typed errors; what to do with them is decided above.
"""
