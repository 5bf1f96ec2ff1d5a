"""ONNX Runtime's arena gives back what a large batch grew (issue #24: memory after a burst)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import onnx
from onnx import TensorProto, helper


def _wide_model(path: Path) -> Path:
    """Three elementwise steps on [N, 16, 256, 256]: 4 MiB of activations per sample and step,
    answered by a [N, 16] mean, so the outputs hold next to nothing."""
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 16, 256, 256])
    y = helper.make_tensor_value_info("mean", TensorProto.FLOAT, ["N", 16])
    nodes = [helper.make_node("Relu", ["input"], ["a"]),
             helper.make_node("Sigmoid", ["a"], ["b"]),
             helper.make_node("Mul", ["a", "b"], ["c"]),
             helper.make_node("ReduceMean", ["c"], ["mean"], axes=[2, 3], keepdims=0)]
    model = helper.make_model(helper.make_graph(nodes, "wide", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, path)
    return path


_CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path

    import numpy as np

    from cuvil_edge.daemon.footprint import trim_heap
    from cuvil_edge.runtime.base import BackendOptions
    from cuvil_edge.runtime.ort import OrtBackend, rss_bytes

    MB = 1 << 20
    # The daemon's arena: one per process, shared by every session (BackendOptions' default).
    b = OrtBackend(Path(sys.argv[1]), BackendOptions(intra_op_threads=1))
    rng = np.random.default_rng(0)
    one = {"input": rng.random((1, 16, 256, 256), dtype=np.float32)}
    eight = {"input": np.repeat(one["input"], 8, axis=0)}
    with b:
        first = b.infer(one)["mean"]
        small = rss_bytes()
        b.infer(eight)
        del eight  # the input is this script's, not the runtime's scratch
        trim_heap()
        grown = rss_bytes()
        b.release_scratch(one)
        trim_heap()
        released = rss_bytes()
        np.testing.assert_allclose(b.infer(one)["mean"], first, rtol=1e-6)  # still answers the same
    print(small / MB, grown / MB, released / MB)
""")


def test_release_scratch_hands_back_what_batch_8_grew(tmp_path: Path) -> None:
    # In a process of its own: the arena is one per process, and chunks earlier tests' sessions
    # left free would take batch 8's activations without growing it.
    done = subprocess.run([sys.executable, "-c", _CHILD, str(_wide_model(tmp_path / "wide.onnx"))],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    small, grown, released = (float(v) for v in done.stdout.split())
    # Batch 8 leaves at least one of its 32 MiB intermediates in the arena after the run ...
    assert grown - small > 24, (small, grown)
    # ... and one batch-1 run with the arena's shrinkage gives it back.
    assert grown - released > 24, (small, grown, released)
    assert released - small < 16, (small, released)
