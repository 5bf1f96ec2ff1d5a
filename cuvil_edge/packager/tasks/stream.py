"""Streaming models with recurrent state: run both as a stream, each carrying its own state.

Validating frame by frame with the original's states fed to both models (what a plain comparison of
samples does) hides the error that compounds through the state; a voice-activity detector can then
agree on every frame and still mark almost nothing as speech once it runs on its own. Here each model
runs over the evaluation frames in order, feeding its own state outputs back (``[postprocess] state
= {input = "output"}``), starting from zeros and starting again every ``stream_length`` frames
(0: one stream). The decision output (``decision``, else the first output that is not a state)
thresholded at ``threshold`` gives the decision agreement; drift is the mean absolute difference of
the decision output, also over the first and the last quarter of the frames (does it grow?).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cuvil_edge.errors import DataError
from cuvil_edge.packager.tasks._common import Outputs

__all__ = ["GOALS", "METRICS", "decision_output", "infer", "metrics", "run_stream"]

GOALS = {"min_decision_agreement": 0.95}
METRICS = ("decision_agreement", "decision_drift")


def decision_output(names: list[str], post: dict[str, Any]) -> str:
    fed = set(post.get("state", {}).values())
    if post.get("decision"):
        return str(post["decision"])
    rest = [n for n in names if n not in fed]
    return rest[0] if rest else names[0]


def run_stream(session: Any, data: Any, post: dict[str, Any]) -> Outputs:
    """Run ``session`` over ``data``'s samples in order as a stream; outputs stacked per frame.

    Raises:
        DataError: a state input or its feeding output is not in the model.
    """
    state_map: dict[str, str] = dict(post.get("state", {}))
    in_names = {i.name for i in session.get_inputs()}
    out_names = [o.name for o in session.get_outputs()]
    for inp, out in state_map.items():
        if inp not in in_names or out not in out_names:
            raise DataError(f"[postprocess] state maps input '{inp}' to output '{out}', but the model has inputs "
                            f"{sorted(in_names)} and outputs {out_names}")
    length = int(post.get("stream_length", 0))
    collected: dict[str, list[np.ndarray]] = {n: [] for n in out_names}
    state: dict[str, np.ndarray] = {}
    for t, (_, _, feed) in enumerate(data.batches(1)):
        if not state or (length and t % length == 0):
            state = {k: np.zeros_like(np.asarray(feed[k], dtype=np.float32)) for k in state_map}
        feed = {**feed, **state}
        values = session.run(out_names, feed)
        got = dict(zip(out_names, values, strict=True))
        for n in out_names:
            collected[n].append(np.asarray(got[n], dtype=np.float32))
        state = {k: np.asarray(got[v], dtype=np.float32) for k, v in state_map.items()}
    return {n: np.stack(v) for n, v in collected.items()}


def metrics(ref: Outputs, test: Outputs, post: dict[str, Any], labels: np.ndarray | None) -> dict[str, Any]:
    name = decision_output(list(ref), post)
    thr = float(post.get("threshold", 0.5))
    r = np.asarray(ref[name], np.float64).reshape(len(ref[name]), -1)
    t = np.asarray(test[name], np.float64).reshape(len(test[name]), -1)
    dr, dt = r > thr, t > thr
    err = np.abs(r - t).mean(axis=1)
    q = max(1, len(err) // 4)
    return {
        "frames": len(r),
        "decision_output": name,
        "decision_agreement": float((dr == dt).mean()),
        "reference_positive_rate": float(dr.mean()),
        "positive_rate": float(dt.mean()),
        "decision_drift": float(err.mean()),
        "drift_first_quarter": float(err[:q].mean()),
        "drift_last_quarter": float(err[-q:].mean()),
    }


def infer(shapes: dict[str, tuple[int, ...]], values: Outputs | None, feed: dict[str, np.ndarray] | None = None
          ) -> dict[str, Any] | None:
    """Outputs shaped exactly like a float input (not the only one) feed that input back: state."""
    if values is None or not feed:
        return None
    floats = {k: np.asarray(v).shape for k, v in feed.items() if np.asarray(v).dtype.kind == "f"}
    if len(floats) < 2:
        return None
    state: dict[str, str] = {}
    for out, val in values.items():
        shape = np.asarray(val).shape
        for inp, ishape in floats.items():
            if inp not in state and ishape == shape and len(shape) >= 2 and np.prod(shape) > 1:
                state[inp] = out
                break
    if not state or len(state) == len(floats):
        return None
    spec: dict[str, Any] = {"kind": "stream", "state": state, "threshold": 0.5, "stream_length": 0}
    spec["decision"] = decision_output(list(values), spec)
    return spec
