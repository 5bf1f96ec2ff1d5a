"""Where cuvil-edge caches things on a host: built models, engines.

A foundation helper, so every layer finds the same directory (:mod:`cuvil_edge.models` and the engine
store, :mod:`cuvil_edge.bundle.engine_store`, re-use it); ``cuvil_edge.models`` re-exports it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir() -> Path:
    """``$CUVIL_EDGE_CACHE`` or ``~/.cache/cuvil-edge``."""
    root = os.environ.get("CUVIL_EDGE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "cuvil-edge"
    )
    return Path(root)
