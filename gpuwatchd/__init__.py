"""gpuwatchd: a node-level GPU health daemon.

The public surface is the command line (``gpuwatchd --help``), the HTTP endpoints and the
metric names documented in docs/. Modules are importable for tests and tools, but only
the names in ``__all__`` are promised to stay.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
