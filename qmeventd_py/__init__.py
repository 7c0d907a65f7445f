"""qmeventd_py: a drop-in QMP event server that feeds the cluster extend queue."""

from pvestord import __version__

__all__ = ["__version__"]
