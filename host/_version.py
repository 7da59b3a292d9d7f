"""The package's version, in a module of its own: what imports it needs nothing else."""

__version__ = "0.1.0"
