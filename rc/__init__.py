"""rc: a GPU-lab device scheduler.

This module ships inside the worker zipapp, so it holds the version and imports
nothing.
"""

__version__ = "0.1.0"
