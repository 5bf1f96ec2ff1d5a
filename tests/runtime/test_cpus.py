"""ONNX Runtime's thread count is set explicitly, so it never pins threads (the unit refuses it)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from cuvil_edge.runtime.cpus import usable_cores

# A seccomp filter that refuses sched_setaffinity with EPERM, as the daemon's unit does with
# SystemCallFilter=~@resources; everything else is allowed. Installed in a child process only.
_SECCOMP = textwrap.dedent("""
    import ctypes, os, platform, struct
    libc = ctypes.CDLL(None, use_errno=True)
    nr = {"x86_64": 203, "aarch64": 122}[platform.machine()]
    def ins(code, k, jt=0, jf=0):
        return struct.pack("HBBI", code, jt, jf, k)
    prog = ins(0x20, 0) + ins(0x15, nr, 0, 1) + ins(0x06, 0x00050000 | 1) + ins(0x06, 0x7FFF0000)
    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
    fprog = Fprog(4, prog)
    assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
    assert libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0  # PR_SET_SECCOMP, filter
    try:
        os.sched_setaffinity(0, os.sched_getaffinity(0))
        raise SystemExit("the filter did not take")
    except PermissionError:
        pass
""")


def _siblings(root: Path, lists: dict[int, str]) -> Path:
    for cpu, text in lists.items():
        topo = root / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "thread_siblings_list").write_text(text + "\n")
    return root


def test_usable_cores_counts_smt_siblings_once(tmp_path: Path) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    apart = _siblings(tmp_path / "apart", {c: str(c) for c in allowed})
    assert usable_cores(apart) == len(allowed)
    together = _siblings(tmp_path / "together", {c: ",".join(map(str, allowed)) for c in allowed})
    assert usable_cores(together) == 1
    assert usable_cores(tmp_path / "missing") == len(allowed)  # no topology: each CPU a core


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux x86_64/aarch64 with 2 CPUs or more")
def test_no_thread_pinning_where_sched_setaffinity_is_refused(tmp_path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "relu.onnx"
    onnx.save(model, str(path))

    def run(body: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", _SECCOMP + textwrap.dedent(body)], capture_output=True,
                              text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})

    # The premise: ONNX Runtime left to its default pins threads and complains under the filter.
    default = run(f"""
        import onnxruntime as ort
        ort.InferenceSession({str(path)!r}, providers=["CPUExecutionProvider"])
    """)
    assert default.returncode == 0, default.stderr
    assert "pthread_setaffinity_np failed" in default.stderr
    ours = run(f"""
        from pathlib import Path
        import numpy as np
        from cuvil_edge.runtime.ort import OrtBackend
        with OrtBackend(Path({str(path)!r})) as b:
            print(b.infer({{"x": np.ones((1, 4), np.float32)}})["y"].sum())
    """)
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout.strip() == "4.0"
    assert "setaffinity" not in ours.stderr, ours.stderr
