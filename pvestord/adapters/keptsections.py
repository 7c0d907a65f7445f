"""This node's copy of the ``pvestord:`` sections of storage.cfg (:mod:`pvestord.policy.vanished`).

Node-local, under ``/var/lib/pvestord``, and never in ``/etc/pve``: the point
is to outlive a rewrite of the cluster's files by a node that does not know
the sections. Replaced whole and fsynced (:mod:`pvestord.adapters.atomicfile`):
a crash leaves the old copy or the new one, and a copy that survives a
reboot is what lets a daemon started after the loss still see it.

The daemon is the only writer. ``pvestord storage restore`` only reads it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pvestord.adapters import atomicfile
from pvestord.errors import PvestordError
from pvestord.policy.queueformat import QueueError
from pvestord.policy.vanished import Kept

log = logging.getLogger(__name__)

#: The file, under the daemon's state folder (``--state-dir``).
FILE_NAME = "storage-sections.json"
#: Far beyond any storage.cfg's share of pvestord sections.
MAX_READ = 4 << 20


class KeptSectionsError(PvestordError):
    """The copy cannot be read or written."""


def read(path: Path) -> dict[str, Kept]:
    """The kept sections by id; empty when there is no file yet.

    :raises KeptSectionsError: unreadable or malformed (the caller decides
        whether to start afresh; the file is left as it is for the admin).
    """
    try:
        data = atomicfile.read_bounded(path, MAX_READ)
    except QueueError as err:
        raise KeptSectionsError(str(err)) from err
    if not data:
        return {}
    try:
        doc = json.loads(data)
        sections = doc["sections"]
        kept = {}
        for sid, item in sections.items():
            vanished = item.get("vanished")
            kept[sid] = Kept(str(sid), _text(item["text"]), float(item["seen"]),
                             None if vanished is None else float(vanished))
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise KeptSectionsError(f"{path}: not a copy of storage sections pvestord wrote:"
                                f" {err!r}") from err
    return kept


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"section text is {type(value).__name__}, not a string")
    return value


def write(path: Path, kept: Mapping[str, Kept]) -> None:
    """Replace the file with ``kept``, durably.

    :raises KeptSectionsError: it cannot be written.
    """
    doc = {"version": 1, "sections": {
        sid: {"text": k.text, "seen": k.seen, "vanished": k.vanished}
        for sid, k in sorted(kept.items())}}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomicfile.replace_whole(path, (json.dumps(doc, indent=1) + "\n").encode())
    except (OSError, QueueError) as err:
        raise KeptSectionsError(f"cannot keep the pvestord sections in {path}: {err}") from err
