"""The root of every error the model raises on purpose.

Its own, not pvestord's: the package imports nothing of pvestord, so that it
can be read, tested and shipped without it. A caller that wants "the
prediction could not be made, with a readable message" catches
:class:`HaPlacementError`; ``pvestord placement`` turns it into its own error
(``pvestord: message``, exit 1).
"""

from __future__ import annotations


class HaPlacementError(Exception):
    """Base class of every deliberate error of the placement model."""
