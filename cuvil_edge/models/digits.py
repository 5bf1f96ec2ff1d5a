"""A tiny CNN for scikit-learn's 8x8 digits: the small, fast model of tests and serving benchmarks.

Trained in a few seconds without a deep-learning framework: convolution filters are the principal
components of image patches (both signs, so ReLU keeps each half), and the classifier head is a
multinomial logistic regression on the pooled features. Structure: Conv-ReLU-MaxPool twice, then
Gemm, input ``[N,1,8,8]`` (pixel values / 16), output ``logits [N,10]``.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from cuvil_edge.errors import ModelError
from cuvil_edge.models._onnx_builder import GraphBuilder

__all__ = ["build_digits_cnn_model", "load_digits_data"]

TRAIN_SAMPLES = 1200


def load_digits_data() -> tuple[np.ndarray, np.ndarray]:
    """Digits as float32 ``[N,1,8,8]`` in 0..1 and int labels."""
    from cuvil_edge._optional import optional_import

    datasets = optional_import("sklearn.datasets", needed_for="the digits model",
                               install="pip install scikit-learn", error=ModelError)
    d = datasets.load_digits()
    return (d.images / 16.0).astype(np.float32)[:, None], d.target.astype(np.int64)


def _patches(x: np.ndarray) -> np.ndarray:
    """3x3 patches with zero padding: ``[N*H*W, C*9]``."""
    n, c, h, w = x.shape
    p = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = np.stack([p[:, :, i : i + h, j : j + w] for i in range(3) for j in range(3)], axis=2)
    return cols.transpose(0, 3, 4, 1, 2).reshape(n * h * w, c * 9)


def _pca_filters(x: np.ndarray, count: int) -> np.ndarray:
    cols = _patches(x)
    cols = cols - cols.mean(axis=0)
    _, _, vt = np.linalg.svd(cols[:: max(1, len(cols) // 20000)], full_matrices=False)
    comps = vt[:count]
    filt = np.concatenate([comps, -comps]).reshape(2 * count, x.shape[1], 3, 3)
    return filt.astype(np.float32)


def _features(g: GraphBuilder, x: np.ndarray, out: str) -> np.ndarray:
    inp = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 1, 8, 8])
    outv = helper.make_tensor_value_info(out, TensorProto.FLOAT, None)
    graph = helper.make_graph(list(g.nodes), "partial", [inp], [outv], list(g.inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"input": x})[0]


def build_digits_cnn_model() -> tuple[onnx.ModelProto, float]:
    """Build and train; returns the model and its accuracy on the held-out digits."""
    from sklearn.linear_model import LogisticRegression

    x, y = load_digits_data()
    xtr, ytr, xte, yte = x[:TRAIN_SAMPLES], y[:TRAIN_SAMPLES], x[TRAIN_SAMPLES:], y[TRAIN_SAMPLES:]
    g = GraphBuilder()
    f1 = _pca_filters(xtr, 8)
    h = g.op("Relu", [g.conv("input", f1, np.zeros(16, np.float32), "conv1", pads=(1, 1, 1, 1))], name="relu1")
    h = g.op("MaxPool", [h], name="pool1", kernel_shape=[2, 2], strides=[2, 2])
    a1 = _features(g, xtr, h)
    f2 = _pca_filters(a1, 16)
    h = g.op("Relu", [g.conv(h, f2, np.zeros(32, np.float32), "conv2", pads=(1, 1, 1, 1))], name="relu2")
    h = g.op("MaxPool", [h], name="pool2", kernel_shape=[2, 2], strides=[2, 2])
    h = g.op("Flatten", [h], name="flatten", axis=1)
    feats_tr = _features(g, xtr, h)
    scale = float(feats_tr.std()) or 1.0
    clf = LogisticRegression(C=1.0, max_iter=2000)
    clf.fit(feats_tr / scale, ytr)
    w = g.const("fc.weight", (clf.coef_ / scale).astype(np.float32))
    b = g.const("fc.bias", clf.intercept_.astype(np.float32))
    logits = g.op("Gemm", [h, w, b], name="fc", transB=1)
    inp = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 1, 8, 8])
    model = g.model([inp], [(logits, "logits", ["N", 10])], "digits_cnn")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    accuracy = float((sess.run(None, {"input": xte})[0].argmax(1) == yte).mean())
    return model, accuracy
