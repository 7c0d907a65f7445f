"""The manual pages the package installs say what the command lines take.

They are committed in packaging/man (the Debian build installs them as they
are); written again here from the parsers, they must come out the same:
after a change to an option, run ``python -m pvestord.cli.manpage packaging/man``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pvestord.cli import build_parser
from pvestord.cli.manpage import pages, roff_text
from qmeventd_py.options import build_parser as qmeventd_parser

MAN_DIR = Path(__file__).resolve().parents[2] / "packaging" / "man"


def test_committed_pages_are_current() -> None:
    for name, text in pages().items():
        committed = (MAN_DIR / name).read_text()
        assert committed == text, (
            f"packaging/man/{name} is stale: run python -m pvestord.cli.manpage packaging/man")


def _walk(parser: argparse.ArgumentParser, prog: str) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(prog, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _walk(sub, f"{prog} {name}")
    return found


def test_every_command_and_option_is_there() -> None:
    text = pages()
    for page, parser in (("pvestord.1", build_parser()), ("qmeventd-py.8", qmeventd_parser())):
        for path, sub in _walk(parser, parser.prog):
            if path != parser.prog:
                assert f".SS {roff_text(path)}\n" in text[page], path
            for action in sub._actions:
                for option in action.option_strings:
                    assert f"\\fB{roff_text(option)}\\fR" in text[page], (path, option)


def test_pages_name_their_program_and_section() -> None:
    text = pages()
    assert text["pvestord.1"].startswith(".TH PVESTORD 1 ")
    assert text["qmeventd-py.8"].startswith(".TH QMEVENTD-PY 8 ")
    assert "\n.SH NAME\npvestord \\- " in text["pvestord.1"]


def test_roff_requests_and_backslashes_are_escaped() -> None:
    assert roff_text(".x and 'y\n.z") == "\\&.x and 'y\n\\&.z"
    assert roff_text("a\\b-c") == "a\\eb\\-c"
