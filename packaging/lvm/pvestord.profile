# LVM command profile of pvestord's persistent lvm shells (pvestord/lvmshell.py).
#
# pvestord starts `lvm` as a shell with LVM_COMMAND_PROFILE=pvestord and
# LVM_REPORT_FD set, as lvmdbusd does. These settings make every command in
# that shell write one JSON document to the report descriptor, ending with the
# command's own status: that is how pvestord knows a command finished and
# whether it worked. LVM does not allow them in --config inside the shell.
#
# Nothing else reads this profile. Without it, pvestord runs each LVM command
# as a separate process, which is slower, and logs a warning.

report {
	output_format = "json"
}

log {
	report_command_log = 1
	command_log_selection = "all"
}
