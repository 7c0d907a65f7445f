"""The command line imports only the module of the sub-command asked for."""

from __future__ import annotations

import argparse
import importlib
import re
import subprocess
import sys

import pytest

from pvestord.cli import COMMANDS, build_parser, requested_command


def registered(module: str) -> set[str]:
    sub = argparse.ArgumentParser().add_subparsers()
    importlib.import_module(module).register(sub)
    return set(sub.choices)


@pytest.mark.parametrize("module", sorted(set(COMMANDS.values())))
def test_the_table_names_exactly_what_each_module_registers(module: str) -> None:
    assert registered(module) == {name for name, owner in COMMANDS.items() if owner == module}


@pytest.mark.parametrize(("argv", "command"), [
    (["run", "--node", "a"], "run"),
    (["-v", "--queue", "/q", "drives", "--json"], "drives"),
    (["--queue=/q", "volume", "create", "thin1", "100", "8G"], "volume"),
    (["--queue", "run"], None),              # "run" is the queue's path here
    (["--help"], None),
    ([], None),
    (["nonsense"], None),
    (["--queue"], None),                     # left to the full parser's message
])
def test_the_requested_command_is_found_after_the_global_options(
        argv: list[str], command: str | None) -> None:
    assert requested_command(argv) == command


def test_a_command_alone_parses_as_in_the_full_parser() -> None:
    argv = ["-v", "--queue", "/q", "extend", "--help"]
    for parser in (build_parser(), build_parser(requested_command(argv))):
        with pytest.raises(SystemExit) as done:
            parser.parse_args(argv)
        assert done.value.code == 0
    args = build_parser("status").parse_args(["--queue", "/q", "status", "--json"])
    assert (args.command, str(args.queue), args.json) == ("status", "/q", True)


def test_a_command_run_imports_no_other_command_module() -> None:
    probe = ("import sys\nfrom pvestord.cli import main\n"
             "try:\n    main(['queue', '--help'])\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in sys.modules if m.startswith('pvestord.cli.')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,  # noqa: S603
                         check=True, timeout=60).stdout.strip().splitlines()[-1]
    assert out == str(["pvestord.cli.options", "pvestord.cli.queue"])


def test_an_unknown_command_is_refused_with_every_command_listed() -> None:
    probe = "import sys\nfrom pvestord.cli import main\nsys.exit(main(['bogus']))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,  # noqa: S603
                          check=False, timeout=60)
    assert done.returncode == 2
    # Each name as a word: argparse quotes the choices up to Python 3.13.0 and
    # lists them bare from 3.13.1 (Debian 13 has 3.13.5).
    listed = done.stderr.rpartition("choose from")[2]
    missing = [name for name in COMMANDS
               if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", listed)]
    assert missing == [], done.stderr
