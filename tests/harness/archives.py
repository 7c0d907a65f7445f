"""Unpacking the upstream source tarballs the tests read."""

from __future__ import annotations

import tarfile
from collections.abc import Sequence
from pathlib import Path


def extract(archive: tarfile.TarFile, dest: Path, members: Sequence[tarfile.TarInfo]) -> None:
    """``members`` of ``archive`` below ``dest``, with tarfile's ``data`` filter
    where Python has it (3.11.4 on; Debian 12's 3.11.2 has not): Python 3.14
    filters by default and 3.13 warns for every call without one."""
    if hasattr(tarfile, "data_filter"):
        archive.extractall(dest, members=members, filter="data")
    else:
        archive.extractall(dest, members=members)
