"""This node's view of an LV against LVM's metadata: pure comparison."""

from __future__ import annotations

import enum


class TableState(enum.Enum):
    """This node's device-mapper table of an LV against the LV's metadata."""

    MATCH = "match"
    #: Smaller than the metadata: another node grew the LV; refresh before
    #: anything else (a threshold armed past the table's end never fires, and
    #: reads past it return zeros).
    BEHIND = "behind"
    #: Larger than the metadata: an extension was lost, or the LV was shrunk
    #: elsewhere. The PEs past the metadata's end are free in the VG, and an
    #: ``lvextend`` would map others over data the guest wrote there: never
    #: extend, never resume; an operator must look.
    AHEAD = "ahead"


def table_state(lv_size: int, table_size: int) -> TableState:
    """Compare the LV's size in LVM's metadata with its device-mapper table's."""
    if table_size < lv_size:
        return TableState.BEHIND
    if table_size > lv_size:
        return TableState.AHEAD
    return TableState.MATCH
