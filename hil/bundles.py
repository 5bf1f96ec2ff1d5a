"""The bundles the on-device suite deploys: a small image classifier, signed, with a real sample.

The model is a real ONNX graph (conv, relu, pooling, matmul) over a ``[N, 3, 16, 16]`` input
with the daemon's image pre-processing in front (resize + normalize, the NEON kernels' job on the
board). Its validation sample carries ONNX Runtime's FP32 outputs computed here, so the deploy
health gate on the board compares the board's arithmetic with this machine's. A "bad" bundle
stores shifted expected outputs: its health gate must fail on any board.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

__all__ = ["MODEL_NAME", "host_reference", "make_bundle", "make_keys", "make_model", "make_suite_bundle"]

MODEL_NAME = "hilnet"
PREPROCESS = {"kind": "image", "size": [16, 16], "mean": [127.0, 127.0, 127.0], "std": [64.0, 64.0, 64.0],
              "layout": "NCHW", "color": "RGB", "resize": "bilinear"}


def make_keys(out_dir: Path) -> tuple[Path, Path]:
    """A fresh minisign-compatible key pair: (secret, public)."""
    from cuvil_edge.bundle.signing import generate_keypair

    out_dir.mkdir(parents=True, exist_ok=True)
    secret, public = out_dir / "sign.key", out_dir / "sign.pub"
    if not secret.is_file():
        generate_keypair(secret, public)
    return secret, public


def make_model(path: Path, classes: int = 10, seed: int = 7) -> Path:
    """The suite's classifier: float32 ``[N,3,16,16]`` -> logits ``[N,classes]``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)
    b = (rng.standard_normal(8) * 0.1).astype(np.float32)
    fc = rng.standard_normal((8, classes)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["input", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"], axis=1),
        helper.make_node("MatMul", ["f", "fc"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, MODEL_NAME,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 16, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"), numpy_helper.from_array(fc, "fc")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def host_reference(model: Path, feed: dict[str, np.ndarray]) -> np.ndarray:
    """FP32 ONNX Runtime on this machine: the logits the board must reproduce."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return np.asarray(sess.run(["logits"], feed)[0])


def make_suite_bundle(out: Path, secret_key: Path, version: str, *, bad_gate: bool = False,
                      target: str = "generic-arm64", padding: int = 0, name: str = MODEL_NAME) -> Path:
    """A signed bundle of the suite's model at ``version`` (``bad_gate``: wrong expected outputs;
    ``padding``: a payload member of that many random bytes, for power cuts during the upload and
    the extraction); for a Jetson ``target`` the TensorRT form with its engine build plans."""
    model = out.parent / "hilnet.onnx"
    if not model.is_file():
        make_model(model)
    sample = np.random.default_rng(11).standard_normal((4, 3, 16, 16)).astype(np.float32)
    return make_bundle(out, secret_key, model, name, version, {"input": sample}, {"logits": 10},
                       preprocess=PREPROCESS, bad_gate=bad_gate, target=target, padding=padding)


def make_bundle(out: Path, secret_key: Path, model: Path, name: str, version: str,
                sample: dict[str, np.ndarray], outputs: dict[str, int], *, preprocess: dict | None = None,
                bad_gate: bool = False, target: str = "generic-arm64", max_batch: int = 8, padding: int = 0) -> Path:
    """A signed FP32 bundle of any ONNX model with a batch axis, gated on ``sample``.

    Args:
        sample: the validation inputs by name (their shapes, batch axis made dynamic, are the
            bundle's input specs); the expected outputs are ONNX Runtime's FP32 on this machine.
        outputs: output name -> width (``[-1, width]`` float32).
        bad_gate: store shifted expected outputs, so the health gate fails on any board.
    """
    import onnxruntime as ort

    from cuvil_edge.bundle import write_bundle
    from cuvil_edge.targets import get_target

    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    expected = dict(zip(outputs, sess.run(list(outputs), sample), strict=True))
    if bad_gate:
        expected = {k: v + 1.0 for k, v in expected.items()}

    def npz(arrays: dict[str, np.ndarray]) -> bytes:
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        return buf.getvalue()

    t = get_target(target)
    manifest = {
        "name": name, "version": version,
        "target": {"name": t.name, "arch": t.arch, "gpu_sm": t.gpu_sm, "releases": [r.__dict__ for r in t.releases]},
        "precision": "fp32", "format_kind": t.runtime_format, "model": "model.onnx",
        "inputs": [{"name": k, "dtype": "float32", "shape": [-1, *v.shape[1:]]} for k, v in sample.items()],
        "outputs": [{"name": k, "dtype": "float32", "shape": [-1, w]} for k, w in outputs.items()],
        "max_batch": max_batch,
        **({"preprocess": preprocess} if preprocess else {}), "postprocess": {"kind": "none"},
        "validation": {"report": "validation.json", "sample_inputs": "sample/inputs.npz",
                       "sample_expected": "sample/expected.npz", "rtol": 1e-3, "atol": 1e-3},
    }
    members: dict[str, Path | bytes] = {
        "model.onnx": model,
        "validation.json": json.dumps({"sample": int(next(iter(sample.values())).shape[0])}).encode(),
        "sample/inputs.npz": npz(sample),
        "sample/expected.npz": npz(expected),
    }
    if t.has_gpu:
        # The TensorRT form: one build plan per TensorRT version of the target, as `package` writes.
        from cuvil_edge.packager.engine_plan import make_build_plans, plan_member_name

        manifest["build_plans"] = []
        for plan in make_build_plans(model, manifest, t):
            members[plan_member_name(plan)] = json.dumps(plan, indent=2).encode()
            manifest["build_plans"].append({"tensorrt": plan["tensorrt"], "path": plan_member_name(plan)})
    if padding:
        members["payload/padding.bin"] = np.random.default_rng(5).bytes(padding)
    write_bundle(out, manifest, members, secret_key)
    return out
