"""``pvestord run|drives|extend``: the extension engine's commands (being written)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Nothing registered yet: the engine's commands land with pvestord.daemon."""
