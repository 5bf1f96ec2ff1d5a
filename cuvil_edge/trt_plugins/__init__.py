"""TensorRT plugins for the pre- and post-processing steps cuvil-edge moves into an engine.

This docstring is the one place that says what exists, how it is built and what has run.

Plugins (the contract, :data:`PLUGINS`; shape rules in :func:`output_shapes`):

``cuvil::normalize_u8``
    ``uint8 [N, H, W, C]`` (camera frames, interleaved) -> ``float32 [N, C, H, W]``,
    ``(x - mean[c]) / std[c]``: layout change, cast and normalisation in one pass.
``cuvil::topk``
    ``float [N, K_in]`` logits -> ``float32 [N, k]`` values and ``int32 [N, k]`` indices, largest
    first (classification post-processing without copying all logits back).

What exists, per plugin (all implementations run on the GPU):

=================  ===========================  ==========================  ==========================
plugin             Python ``tensorrt.plugin``   C++ ``IPluginV3``           CUDA kernel (``cpp/``)
=================  ===========================  ==========================  ==========================
``normalize_u8``   yes (``_python.py``, CuPy)   yes (``normalize_plugin``)  ``launchNormalizeU8``
``topk``           yes (``_python.py``, CuPy)   **no** (kernel only)        ``launchTopK``
=================  ===========================  ==========================  ==========================

What has been compiled or run, and where:

* the arithmetic (:mod:`cuvil_edge.trt_plugins.kernels`, numpy) and the shape rules: tested on
  every CI run;
* the CUDA kernels and ``cpp/test_kernels.cu``: compiled with nvcc 13.0 for ``sm_90`` and run on
  an NVIDIA H200 (every case passed; ``cpp/README.md``);
* the Python plugins (``tensorrt.plugin``, TensorRT >= 10.6): **never run** (no TensorRT on any
  machine we have);
* the C++ ``IPluginV3`` glue (``normalize_plugin.*``, ``plugin_library.cpp``): **never compiled**
  (no TensorRT headers on any machine we have). ``topk`` has no C++ plugin: an engine that needs
  it uses the Python plugin.

How each is built: the Python plugins need no build (:func:`register_python_plugins` registers
them before the ONNX parser runs and before an engine deserializes). The C++ library is the CMake
target ``cuvil_trt_plugins`` (``cpp/CMakeLists.txt``), built against the board's own TensorRT
headers on the board (``cmake -S cpp -B build -DCMAKE_CUDA_ARCHITECTURES=87``) or against a
device sysroot (``cpp/README.md``). ``cuvil-edge`` does not yet build or ship the C++ library for
you: an engine built with it needs the library on the device, loaded before deserialization.

Plugins travel with the plan: a build plan lists the plugins its model uses (``plugins``); the
device build registers them before parsing, the engine record repeats the list, and the daemon
registers them before it deserializes that engine. In an ONNX model a plugin is a node whose
``op_type`` is the plugin name, with attributes ``plugin_namespace="cuvil"`` and
``plugin_version="1"`` (how TensorRT's ONNX parser finds a plugin creator for an op it has no
importer for) plus the plugin's own attributes.

Nothing in this module imports TensorRT.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from cuvil_edge.errors import ModelError

__all__ = [
    "PLUGINS",
    "PluginSpec",
    "cpp_source_dir",
    "get_plugin",
    "output_shapes",
    "plugin_op_names",
    "register_python_plugins",
]


@dataclass(frozen=True)
class PluginSpec:
    """What a plugin is called and what it takes: the contract both implementations follow.

    Args:
        namespace (str): TensorRT plugin namespace.
        name (str): plugin name (also the ONNX ``op_type`` that maps to it).
        version (str): plugin version string.
        inputs (tuple[str, ...]): input tensor names, in order.
        outputs (tuple[str, ...]): output tensor names, in order.
        attrs (dict[str, str]): attribute name -> type (``int``, ``float32[]``).
        summary (str): one line.
    """

    namespace: str
    name: str
    version: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, str]
    summary: str

    @property
    def plugin_id(self) -> str:
        """``namespace::name`` as ``tensorrt.plugin.register`` takes it."""
        return f"{self.namespace}::{self.name}"


PLUGINS: tuple[PluginSpec, ...] = (
    PluginSpec(
        namespace="cuvil", name="normalize_u8", version="1",
        inputs=("image",), outputs=("tensor",),
        attrs={"mean": "float32[]", "std": "float32[]"},
        summary="uint8 NHWC frames -> float32 NCHW, (x - mean[c]) / std[c]",
    ),
    PluginSpec(
        namespace="cuvil", name="topk", version="1",
        inputs=("logits",), outputs=("values", "indices"),
        attrs={"k": "int"},
        summary="largest k of each row: float32 values and int32 indices",
    ),
)


def get_plugin(name: str) -> PluginSpec:
    """The spec of plugin ``name`` (``"topk"`` or ``"cuvil::topk"``)."""
    for spec in PLUGINS:
        if name in (spec.name, spec.plugin_id):
            return spec
    raise ModelError(f"unknown cuvil-edge TensorRT plugin '{name}'; known: "
                     f"{', '.join(s.plugin_id for s in PLUGINS)}")


def plugin_op_names() -> frozenset[str]:
    """ONNX ``op_type`` names that map to a cuvil-edge plugin."""
    return frozenset(spec.name for spec in PLUGINS)


def output_shapes(name: str, input_shapes: Sequence[Sequence[int]], **attrs: Any) -> list[tuple[int, ...]]:
    """Output shapes of plugin ``name`` for the given input shapes (``-1`` stays dynamic).

    Args:
        name (str): the plugin.
        input_shapes (Sequence[Sequence[int]]): one shape per input.
        **attrs: the plugin attributes (``mean``/``std`` for normalize_u8, ``k`` for topk).

    Raises:
        ModelError: wrong rank, attribute or channel count (the same checks the C++
            ``configurePlugin`` and the Python descriptor make).
    """
    spec = get_plugin(name)
    if len(input_shapes) != len(spec.inputs):
        raise ModelError(f"{spec.plugin_id} takes {len(spec.inputs)} input(s), got {len(input_shapes)}")
    shape = tuple(int(d) for d in input_shapes[0])
    if spec.name == "normalize_u8":
        if len(shape) != 4:
            raise ModelError(f"{spec.plugin_id} needs a 4D NHWC input, got shape {list(shape)}")
        n, h, w, c = shape
        mean, std = list(attrs.get("mean", [])), list(attrs.get("std", []))
        if c > 0 and (len(mean) != c or len(std) != c):
            raise ModelError(f"{spec.plugin_id}: mean and std need {c} values (one per channel), "
                             f"got {len(mean)} and {len(std)}")
        if any(float(s) == 0.0 for s in std):
            raise ModelError(f"{spec.plugin_id}: std must not contain 0")
        return [(n, c, h, w)]
    # topk
    if len(shape) != 2:
        raise ModelError(f"{spec.plugin_id} needs a 2D [N, classes] input, got shape {list(shape)}")
    k = int(attrs.get("k", 0))
    if k < 1:
        raise ModelError(f"{spec.plugin_id}: k must be at least 1, got {k}")
    if shape[1] > 0 and k > shape[1]:
        raise ModelError(f"{spec.plugin_id}: k={k} exceeds the {shape[1]} classes")
    return [(shape[0], k), (shape[0], k)]


def cpp_source_dir() -> Path:
    """Directory of the C++ IPluginV3 sources and their CMakeLists.txt."""
    return Path(str(resources.files("cuvil_edge.trt_plugins").joinpath("cpp")))


def register_python_plugins() -> list[str]:
    """Register the Python plugins with TensorRT (>= 10.6); returns their ids.

    Raises:
        ModelError: tensorrt (with ``tensorrt.plugin``) is missing or too old; the message names
            ``pip install cuvil-edge[jetson]``.
    """
    from cuvil_edge._optional import optional_import

    optional_import("tensorrt.plugin", needed_for="TensorRT Python plugins (tensorrt >= 10.6 with tensorrt.plugin)",
                    install="on the device run: pip install cuvil-edge[jetson]", error=ModelError)
    from cuvil_edge.trt_plugins import _python

    return list(_python.register())
