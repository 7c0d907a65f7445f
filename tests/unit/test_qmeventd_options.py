"""qmeventd-py's command line: the cluster node is ``--node``."""

from __future__ import annotations

from pathlib import Path

import pytest

from pvestord.errors import ConfigError
from qmeventd_py.options import make_options, parse_args


def test_node_names_the_cluster_node_and_the_old_spelling_still_works(tmp_path: Path) -> None:
    socket = str(tmp_path / "qmeventd.sock")
    for spelling in ("--node", "--node-name"):
        args = parse_args(["--socket", socket, "--no-cleanup", spelling, "pve1"])
        assert make_options(args).origin == "pve1"


def test_a_node_that_cannot_be_an_origin_is_refused_naming_the_option(tmp_path: Path) -> None:
    args = parse_args(["--socket", str(tmp_path / "s"), "--no-cleanup", "--node", "bad node"])
    with pytest.raises(ConfigError, match="--node"):
        make_options(args)
