"""Embeddings and regressions: every output close to the original's in direction and in size.

Cosine similarity alone misses a change of scale; the relative error ``||q - f|| / ||f||`` sees it.
Both are computed for every output of every model (``_common.output_figures``); for these tasks they
are the goal, on the worst output.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cuvil_edge.packager.tasks._common import Outputs

__all__ = ["GOALS", "METRICS", "infer", "metrics"]

GOALS = {"min_cosine": 0.99}
METRICS = ()


def metrics(ref: Outputs, test: Outputs, post: dict[str, Any], labels: np.ndarray | None) -> dict[str, Any]:
    return {}  # the per-output figures are the task's metrics


def infer(shapes: dict[str, tuple[int, ...]], values: Outputs | None) -> dict[str, Any] | None:
    """Anything else: feature vectors (``[N, D]``, ``[N, S, D]``) are embeddings."""
    if all(len(s) in (2, 3) for s in shapes.values()):
        return {"kind": "embedding"}
    return {"kind": "regression"}
