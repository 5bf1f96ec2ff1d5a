"""Sequence recognisers with CTC: does the quantized model read the same text as the original?

Both ``[N, T, C]`` score sequences are decoded greedily as CTC decoders do (best class per step,
repeats collapsed, the blank dropped); sequence agreement is the share of samples read identically,
the character error rate the edit distance over the original's length.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cuvil_edge.packager.tasks._common import Outputs, as_samples, edit_distance

__all__ = ["GOALS", "METRICS", "greedy_decode", "infer", "metrics"]

GOALS = {"max_char_error_rate": 0.05, "min_sequence_agreement": 0.8}
METRICS = ("sequence_agreement", "char_error_rate")


def greedy_decode(scores: np.ndarray, blank: int = 0) -> list[int]:
    """Best path of one ``[T, C]`` sequence: argmax, collapse repeats, drop blanks."""
    best = scores.argmax(-1)
    out, prev = [], -1
    for c in best.tolist():
        if c != prev and c != blank:
            out.append(c)
        prev = c
    return out


def metrics(ref: Outputs, test: Outputs, post: dict[str, Any], labels: np.ndarray | None) -> dict[str, Any]:
    name = next(iter(ref))
    blank = int(post.get("blank", 0))
    same, edits, length = 0, 0, 0
    rs, ts = as_samples(ref[name]), as_samples(test[name])
    for r, t in zip(rs, ts, strict=True):
        a, b = greedy_decode(r[0], blank), greedy_decode(t[0], blank)
        same += a == b
        edits += edit_distance(a, b)
        length += max(len(a), 1)
    return {"sequence_agreement": same / len(rs), "char_error_rate": edits / length,
            "reference_characters": length, "sequences": len(rs), "sequence_output": name}


def infer(shapes: dict[str, tuple[int, ...]], values: Outputs | None) -> dict[str, Any] | None:
    """One ``[N, T, C]`` output whose steps are probability rows (a softmax over many classes)."""
    if len(shapes) != 1 or values is None:
        return None
    (shape,) = shapes.values()
    if len(shape) != 3 or shape[2] < 3:
        return None
    x = as_samples(next(iter(values.values())))[0][0].astype(np.float64)
    if x.min() >= 0 and np.allclose(x.sum(-1), 1.0, atol=1e-3):
        return {"kind": "ctc", "blank": 0}
    return None
