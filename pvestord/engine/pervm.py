"""What the engine remembers per VM, keyed by tuples that start with its VMID."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import TypeVar

Key = TypeVar("Key", bound=tuple[object, ...])
Value = TypeVar("Value")


def forget_vm(remembered: MutableMapping[Key, Value], vmid: int) -> None:
    """Drop every entry of ``remembered`` whose key starts with ``vmid``: a VM
    that no longer runs here must not leave figures for its next start."""
    for key in [k for k in remembered if k[0] == vmid]:
        del remembered[key]
