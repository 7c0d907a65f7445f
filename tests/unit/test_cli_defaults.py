"""The command line's defaults are DaemonSettings' own (read, never restated),
so ``--help`` shows what the daemon really uses."""

from __future__ import annotations

import dataclasses

from pvestord.adapters.settings import DaemonSettings
from pvestord.cli import build_parser


def test_run_with_no_options_gives_the_settings_defaults() -> None:
    args = build_parser("run").parse_args(["run"])
    for setting in dataclasses.fields(DaemonSettings):
        if setting.name in vars(args) and setting.default is not dataclasses.MISSING:
            assert getattr(args, setting.name) == setting.default, setting.name
    checked = {s.name for s in dataclasses.fields(DaemonSettings)} & set(vars(args))
    assert {"poll_interval", "reconcile_interval", "lvm_timeout", "qmp_timeout",
            "report_interval", "pass_deadline", "lvm_shell", "lock_lifetime",
            "storage_config", "run_dir", "vg_health_dir", "queue"} <= checked
