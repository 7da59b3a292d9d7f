"""hostcore's read-only tools: ``inspect`` and ``export``, looks at a host's data dir.

A package apart from the server (``host``): it reads the store through ``host``'s
read-only helpers and writes nothing, and no module of ``host`` imports it. Its command
line is ``python -m hostview``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from host._platform import unsupported

__all__ = ["export", "inspect"]

if TYPE_CHECKING or unsupported() is None:  # elsewhere: python -m hostview says why
    from hostview._export import export
    from hostview._inspect import inspect
