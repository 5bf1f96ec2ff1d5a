"""The engine builder: a serialized TensorRT engine from an ONNX model and its build plan.

:class:`EngineFromOnnx` is a Polygraphy-style lazy loader: the constructor stores the plan,
``__call__`` imports ``tensorrt`` and builds. TensorRT is not installable on the development
machine; that path is written against the documented Python API (``IBuilder``,
``INetworkDefinition``, ``IBuilderConfig.set_memory_pool_limit``, ``OnnxParser``) and only its
call order is tested, against a recorder.

:func:`build_engine` is what ``cuvil-edge engine build --out`` runs on the device. Plans come from
:mod:`cuvil_edge.packager.engine_plan`; built engines live outside the bundle, in the engine store
(:mod:`cuvil_edge.bundle.engine_store`); the device side of a build into that store is
:mod:`cuvil_edge.packager.engine_device`, the host side :mod:`cuvil_edge.deploy.engines`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cuvil_edge._atomic import atomic_write_bytes
from cuvil_edge.bundle.engine_key import major_minor
from cuvil_edge.bundle.engine_plan import check_build_inputs, load_plan, validate_plan
from cuvil_edge.errors import ModelError

__all__ = ["EngineFromOnnx", "build_engine"]


def _import_tensorrt() -> Any:
    from cuvil_edge.runtime.trt import import_tensorrt

    return import_tensorrt()


def _line_logger(trt: Any, sink: Callable[[str], None]) -> Any:
    """A TensorRT ``ILogger`` that hands each message (INFO and up) to ``sink`` as one line."""

    class LineLogger(trt.ILogger):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity: Any, msg: str) -> None:
            if severity <= trt.ILogger.Severity.INFO:
                level = str(severity).rsplit(".", 1)[-1][:1] or "?"
                for line in str(msg).splitlines() or [""]:
                    sink(f"[{level}] [TRT] {line}")

    return LineLogger()


class EngineFromOnnx:
    """Lazily builds a serialized TensorRT engine from an ONNX file and a plan.

    The constructor only stores; calling the object imports ``tensorrt`` and builds::

        engine_bytes = EngineFromOnnx("model.onnx", plan, timing_cache="t.cache")()

    Args:
        onnx_path (Path): the model (external data beside it is found by the parser).
        plan (Mapping[str, Any]): a build plan (:func:`~cuvil_edge.packager.engine_plan.make_build_plan`).
        timing_cache (Path | None): timing cache file to read and update. Defaults to None.
        log (Callable[[str], None] | None): receives every TensorRT log line (INFO and up) as it
            is emitted, so a build of several minutes shows progress. Defaults to TensorRT's own
            logger at WARNING.
    """

    def __init__(self, onnx_path: Path, plan: Mapping[str, Any], timing_cache: Path | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        self.onnx_path = Path(onnx_path)
        self.plan = validate_plan(plan)
        self.timing_cache = Path(timing_cache) if timing_cache else None
        self.log = log

    def __call__(self) -> bytes:
        trt = _import_tensorrt()
        plan = self.plan
        have = str(getattr(trt, "__version__", "0"))
        if major_minor(have) != major_minor(plan["tensorrt"]):
            raise ModelError(f"plan is for TensorRT {plan['tensorrt']} but this machine has {have}: an engine "
                             "only loads where it was built; use the plan for this TensorRT version")
        logger = _line_logger(trt, self.log) if self.log is not None else trt.Logger(trt.Logger.WARNING)
        if plan.get("plugins"):
            # The ONNX parser maps a node whose op_type has no importer to the plugin creator of
            # that name (namespace from the node's plugin_namespace attribute): register ours first.
            from cuvil_edge.trt_plugins import register_python_plugins

            register_python_plugins()
        builder = trt.Builder(logger)
        flags = 0
        for name in plan["network_flags"]:
            flags |= 1 << int(getattr(trt.NetworkDefinitionCreationFlag, name))
        network = builder.create_network(flags)
        parser = trt.OnnxParser(network, logger)
        source = self.onnx_path
        if plan.get("fp16_casts"):
            # Strongly typed: precision lives in the ONNX, so the FP16 tier becomes casts before parsing.
            source = _with_fp16_casts(self.onnx_path, list(plan["fp16_casts"]))
        if not parser.parse_from_file(str(source)):
            errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
            raise ModelError(f"{self.onnx_path}: TensorRT {have} could not parse the model: "
                             + "; ".join(errors or ["no parser error recorded"]))
        config = builder.create_builder_config()
        ws = int(plan["workspace"]["bytes"])
        if plan["workspace"]["api"] == "set_memory_pool_limit":
            config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, ws)
        else:
            config.max_workspace_size = ws
        if plan["precision_mode"] == "builder_flags":
            # TensorRT 8.x/10.x weak typing; 11.x removed these flags, its plans carry none.
            for name in plan["builder_flags"]:
                config.set_flag(getattr(trt.BuilderFlag, name))
            pinned = set((plan.get("layer_precisions") or {}).get("fp32") or [])
            for i in range(network.num_layers if pinned else 0):
                layer = network.get_layer(i)
                if layer.name in pinned:  # the ONNX parser names each layer after its node
                    layer.precision = trt.float32
                    for j in range(layer.num_outputs):
                        layer.set_output_type(j, trt.float32)
        for shapes in plan["profiles"]:
            profile = builder.create_optimization_profile()
            for name, p in shapes.items():
                profile.set_shape(name, tuple(p["min"]), tuple(p["opt"]), tuple(p["max"]))
            config.add_optimization_profile(profile)
        dla = plan.get("dla")
        if dla:
            config.default_device_type = trt.DeviceType.DLA
            config.DLA_core = int(dla["core"])
            if dla.get("gpu_fallback", True):
                config.set_flag(trt.BuilderFlag.GPU_FALLBACK)
        cache = None
        if self.timing_cache is not None:
            data = self.timing_cache.read_bytes() if self.timing_cache.is_file() else b""
            cache = config.create_timing_cache(data)
            # set_timing_cache returns False when TensorRT refuses the cache (made by another
            # TensorRT version or device): then the build starts from a fresh, empty cache rather
            # than going on with no cache at all.
            if not config.set_timing_cache(cache, ignore_mismatch=False) and data:
                say = self.log or logging.getLogger("cuvil_edge.packager.engine_build").warning
                say(f"[W] [cuvil-edge] timing cache {self.timing_cache} refused by TensorRT {have}; "
                    "starting a fresh one")
                cache = config.create_timing_cache(b"")
                if not config.set_timing_cache(cache, ignore_mismatch=False):
                    raise ModelError(f"TensorRT {have} refused even an empty timing cache")
        serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            raise ModelError(f"{self.onnx_path}: TensorRT {have} failed to build the engine "
                             "(see the TensorRT log above)")
        if cache is not None and self.timing_cache is not None:
            atomic_write_bytes(self.timing_cache, bytes(memoryview(config.get_timing_cache().serialize())))
        return bytes(memoryview(serialized))


def _with_fp16_casts(onnx_path: Path, nodes: list[str]) -> Path:
    """A copy of the model beside it whose ``nodes`` compute in FP16, with casts at their borders."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(onnx_path))
    wanted = set(nodes)
    block = [n.name for n in model.graph.node if n.name not in wanted]
    typed = convert_float_to_float16(model, keep_io_types=True, node_block_list=block)
    _topological_sort(typed.graph)  # the converter appends its input casts after their readers
    out = Path(onnx_path).with_name(Path(onnx_path).stem + ".fp16-casts.onnx")
    onnx.save(typed, str(out))
    return out


def _topological_sort(graph: Any) -> None:
    """Reorder ``graph.node`` so every node comes after the producers of its inputs (stable)."""
    available = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        ready = [n for n in pending if all(i in available for i in n.input)]
        if not ready:
            raise ModelError("the model's graph has a cycle or an input nothing produces")
        for node in ready:
            available.update(node.output)
        ordered.extend(ready)
        ids = {id(n) for n in ready}
        pending = [n for n in pending if id(n) not in ids]
    copies = [type(n)() for n in ordered]
    for dst, src in zip(copies, ordered, strict=True):
        dst.CopyFrom(src)
    del graph.node[:]
    graph.node.extend(copies)


def build_engine(plan_path: Path, onnx_path: Path, out_path: Path, timing_cache: Path | None = None,
                 log: Callable[[str], None] | None = None) -> Path:
    """Build the engine a plan describes, on this machine; writes ``out_path`` atomically.

    This is what ``cuvil-edge engine build --out`` runs on the device; ``log`` receives TensorRT's
    log lines as they come (see :class:`EngineFromOnnx`).

    Raises:
        ModelError: bad plan, a model that is not the one planned for, TensorRT missing
            (naming ``pip install cuvil-edge[jetson]``), parse or build failure.
    """
    plan = load_plan(Path(plan_path))
    onnx_path = Path(onnx_path)
    check_build_inputs(plan, Path(plan_path), onnx_path)
    engine = EngineFromOnnx(onnx_path, plan, timing_cache, log=log)()
    atomic_write_bytes(Path(out_path), engine)
    return Path(out_path)
