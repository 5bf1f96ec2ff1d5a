"""A model too small for a thread pool runs without one (issue #24: gRPC CPU per request)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from cuvil_edge.runtime.base import BackendOptions
from cuvil_edge.runtime.ort import OrtBackend


def _threads() -> int:
    return len(list(Path("/proc/self/task").iterdir()))


def test_run_serially_drops_the_intra_op_pool_and_answers_the_same(digits_model: Path) -> None:
    x = np.random.default_rng(0).random((2, 1, 8, 8), dtype=np.float32)
    shared = BackendOptions(intra_op_threads=2)
    b = OrtBackend(digits_model, shared)
    assert not b.run_serially()  # not active yet: nothing to change
    with b:
        before = b.infer({"input": x})["logits"]
        pooled = _threads()
        assert b.run_serially()
        assert b.options.intra_op_threads == 1 and b.is_active
        assert shared.intra_op_threads == 2  # the options other models share are not touched
        # ONNX Runtime's pool thread is gone (Python's own threads are unchanged).
        assert _threads() == pooled - 1, (pooled, _threads(), threading.active_count())
        np.testing.assert_allclose(b.infer({"input": x})["logits"], before, rtol=1e-5, atol=1e-6)
        assert not b.run_serially()  # already serial
