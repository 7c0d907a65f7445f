"""Manual pages of ``pvestord`` and ``qmeventd-py``, written from their argparse parsers.

The pages are committed (``packaging/man``, installed by dh_installman), so
the Debian build needs neither help2man nor an import of the code;
``tests/unit/test_manpage.py`` writes them again and fails when they differ
from the committed ones, so they stay true to the command lines. Regenerate::

    python -m pvestord.cli.manpage packaging/man

The roff is built from the parsers' actions, not from ``format_help()``,
whose layout changes between Python versions (3.13 prints ``-t, --timeout T``
where 3.11 prints ``-t T, --timeout T``) and with the terminal's width.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from pvestord import __version__

#: Where the package puts the documentation the pages point to.
DOC_DIR = "/usr/share/doc/pvestord"


def roff_text(text: str) -> str:
    """``text`` with roff's special characters escaped, one line per input line."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    # A line starting with '.' or "'" would be read as a request.
    return "\n".join("\\&" + line if line.startswith((".", "'")) else line
                     for line in text.splitlines())


def _expanded_help(action: argparse.Action, prog: str) -> str:
    """The action's help with argparse's %(...)s fields filled in, as --help shows it."""
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    params = {key: value for key, value in vars(action).items() if value is not argparse.SUPPRESS}
    params["prog"] = prog
    for key in ("choices",):
        if params.get(key) is not None:
            params[key] = ", ".join(map(str, params[key]))
    return action.help % params


def _metavar(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.metavar is not None:
        name = action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    elif action.choices is not None:
        name = "{" + ",".join(map(str, action.choices)) + "}"
    else:
        name = action.dest.upper() if action.option_strings else action.dest
    if action.nargs in ("+", argparse.ONE_OR_MORE):
        return f"{name} [{name} ...]"
    if action.nargs in ("*", argparse.ZERO_OR_MORE):
        return f"[{name} ...]"
    if action.nargs in ("?", argparse.OPTIONAL):
        return f"[{name}]"
    return name


Command = tuple[str, str, argparse.ArgumentParser]


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[Command]:
    """(name, one-line help, parser) of each sub-command, in the order given."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def _description(parser: argparse.ArgumentParser, text: str | None) -> list[str]:
    if not text:
        return []
    # As --help shows it: a raw description keeps its line breaks.
    cls = parser.formatter_class
    raw = isinstance(cls, type) and issubclass(cls, argparse.RawDescriptionHelpFormatter)
    lines: list[str] = []
    for paragraph in re.split(r"\n\s*\n", text.strip()):
        lines.append(".PP")
        if raw:
            lines += [".nf", roff_text(paragraph), ".fi"]
        else:
            lines.append(roff_text(" ".join(paragraph.split())))
    return lines


def _arguments(parser: argparse.ArgumentParser, prog: str, *, top: bool = True) -> list[str]:
    """A tagged paragraph per argument (the sub-commands have sections of their
    own; their -h is said once, for the program)."""
    lines: list[str] = []
    for action in parser._actions:
        if (isinstance(action, argparse._SubParsersAction) or action.help == argparse.SUPPRESS
                or (not top and isinstance(action, argparse._HelpAction))):
            continue
        metavar = _metavar(action)
        names = ", ".join(f"\\fB{roff_text(name)}\\fR" for name in action.option_strings)
        tag = f"{names} \\fI{roff_text(metavar)}\\fR" if names and metavar else (
            names or f"\\fI{roff_text(metavar)}\\fR")
        lines += [".TP", tag, roff_text(" ".join(_expanded_help(action, prog).split()))]
    return lines


def _commands(parser: argparse.ArgumentParser, prog: str) -> list[str]:
    lines: list[str] = []
    for name, summary, sub in _subcommands(parser):
        path = f"{prog} {name}"
        lines += [f".SS {roff_text(path)}", roff_text(summary)]
        lines += _description(sub, sub.description)
        lines += _arguments(sub, path, top=False)
        lines += _description(sub, sub.epilog)
        lines += _commands(sub, path)
    return lines


def render(parser: argparse.ArgumentParser, *, section: int, summary: str,
           synopsis: str) -> str:
    """The manual page of ``parser``'s program."""
    prog = parser.prog
    lines = [
        f'.TH {prog.upper()} {section} "" "{prog} {__version__}" "pvestord"',
        ".SH NAME",
        f"{roff_text(prog)} \\- {roff_text(summary)}",
        ".SH SYNOPSIS",
        synopsis,
        ".SH DESCRIPTION",
        *_description(parser, parser.description),
        ".SH OPTIONS",
        *_arguments(parser, prog),
    ]
    commands = _commands(parser, prog)
    if commands:
        lines += [".SH COMMANDS", ".PP",
                  f"Each command also takes \\fB\\-h\\fR: \\fB{roff_text(prog)} \\fICOMMAND\\fR "
                  "\\fB\\-h\\fR prints its help.", *commands]
    if parser.epilog:
        lines += [".SH EXIT STATUS", *_description(parser, parser.epilog)]
    lines += [
        ".SH SEE ALSO",
        f"{DOC_DIR}/operations.md (installing, the hand-over from qmeventd, the logs),",
        f"{DOC_DIR}/examples/storage.cfg.example (a thin storage and its options).",
        "",
    ]
    return "\n".join(lines)


def pages() -> dict[str, str]:
    """File name -> text of every page the package installs."""
    from pvestord.cli import build_parser
    from qmeventd_py.options import build_parser as qmeventd_parser

    return {
        "pvestord.1": render(
            build_parser(), section=1,
            summary="thin provisioning for qcow2 disks on thick, shared LVM",
            synopsis="\\fBpvestord\\fR [\\fIOPTIONS\\fR] \\fICOMMAND\\fR [\\fIARGS\\fR]"),
        "qmeventd-py.8": render(
            qmeventd_parser(), section=8,
            summary="QMP event server for QEMU, replacing Proxmox's qmeventd",
            synopsis="\\fBqmeventd\\-py\\fR [\\fIOPTIONS\\fR] [\\fIPATH\\fR]"),
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m pvestord.cli.manpage OUTDIR", file=sys.stderr)
        return 2
    out = Path(args[0])
    out.mkdir(parents=True, exist_ok=True)
    for name, text in pages().items():
        (out / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
