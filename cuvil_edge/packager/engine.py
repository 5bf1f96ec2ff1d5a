"""TensorRT engine build plans, the engine cache, the builder and remote builds on a device.

Engines are built where they run (docs/bundle-format.md): the packager writes one JSON *build plan* per
TensorRT version of the target into the bundle, and the device (or a host orchestrating a remote
build over SSH) turns ``plan + model.onnx`` into an engine keyed by
``(L4T, TensorRT, SM, DLA core)``. A plan says everything the builder needs:

* the precision mode: ``strongly_typed`` for TensorRT >= 11 (the FP16/INT8 builder flags and
  INT8 calibrators are gone; precision comes from the ONNX: Q/DQ with zero-point 0, FP16 casts)
  or when asked for on 10.x; ``builder_flags`` (``FP16``, ``INT8``) for TensorRT 8.x and 10.x;
* network creation flags (``EXPLICIT_BATCH`` on 8.x, ``STRONGLY_TYPED`` on 10.x when asked for);
* the workspace limit from the board's RAM and the API that sets it;
* optimization profiles (min/opt/max per dynamic input, from the recipe's max batch);
* DLA core and GPU fallback, the timing cache name, the engine key and engine file name.

:class:`EngineFromOnnx` is a Polygraphy-style lazy loader: the constructor stores the plan,
``__call__`` imports ``tensorrt`` and builds. TensorRT is not installable on the development
machine; that path is written against the documented Python API (``IBuilder``,
``INetworkDefinition``, ``IBuilderConfig.set_memory_pool_limit``, ``OnnxParser``) and only its
call order is tested, against a recorder.

Built engines live outside the bundle, in an engine store keyed the same way
(:mod:`cuvil_edge.packager.engine_store`); the device side of a build is
:mod:`cuvil_edge.packager.engine_device`, the host side :mod:`cuvil_edge.deploy.engines`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cuvil_edge._atomic import atomic_write_bytes
from cuvil_edge.bundle.engine_key import EngineKey, engine_cache_key
from cuvil_edge.bundle.engine_plan import PLAN_FORMAT, load_plan, validate_plan
from cuvil_edge.errors import ModelError, RecipeError
from cuvil_edge.targets import JetPackRelease, Target

__all__ = [
    "PLAN_FORMAT",
    "EngineFromOnnx",
    "EngineKey",
    "build_engine",
    "engine_cache_key",
    "load_plan",
    "make_build_plan",
    "make_build_plans",
    "plan_member_name",
    "validate_plan",
    "workspace_bytes",
]

PRECISIONS = ("fp32", "fp16", "int8", "mixed")
_MIB = 1 << 20
_GIB = 1 << 30
_JETSON_EXTRA = "pip install cuvil-edge[jetson]"


def _mm(version: str) -> tuple[int, int]:
    from cuvil_edge.packager.inspect import _major_minor

    return _major_minor(version)


# ------------------------------------------------------------------------------------ keys


# ------------------------------------------------------------------------------- plan facts


def workspace_bytes(target: Target) -> int:
    """Builder workspace limit: 1/8 of the board's RAM, between 256 MiB and 4 GiB.

    Jetson RAM is shared by the CPU, GPU and the OS, and the engine is built on the board
    beside the running daemon, so the builder gets a bounded slice rather than the whole GPU.
    """
    return int(min(4 * _GIB, max(256 * _MIB, target.ram_bytes // 8)))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _model_facts(model_path: Path) -> dict[str, Any]:
    import onnx

    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception as exc:  # DecodeError, OSError ...
        raise ModelError(f"{model_path}: not a readable ONNX model ({exc})") from exc
    ops = {n.op_type for n in model.graph.node}
    fp16 = onnx.TensorProto.FLOAT16
    has_fp16 = any(t.data_type == fp16 for t in model.graph.initializer) or any(
        n.op_type == "Cast" and any(a.name == "to" and a.i == fp16 for a in n.attribute)
        for n in model.graph.node
    ) or any(vi.type.tensor_type.elem_type == fp16 for vi in list(model.graph.input) + list(model.graph.output))
    from cuvil_edge.trt_plugins import get_plugin, plugin_op_names

    plugins = sorted(get_plugin(op).plugin_id for op in ops & plugin_op_names())
    return {"model": model, "has_qdq": bool(ops & {"QuantizeLinear", "DequantizeLinear"}), "has_fp16": has_fp16,
            "plugins": plugins}


def _manifest_shapes(manifest: Mapping[str, Any]) -> dict[str, list[int]]:
    shapes = {}
    for entry in manifest.get("inputs") or []:
        shape = entry.get("shape") or []
        if shape and all(isinstance(d, int) for d in shape):
            shapes[str(entry["name"])] = [int(d) for d in shape]
    return shapes


def plan_member_name(plan: Mapping[str, Any]) -> str:
    """Bundle member path of a plan: ``engine/plan-trt<version>.json``."""
    return f"engine/plan-trt{plan['tensorrt']}.json"


def make_build_plan(
    model_path: Path,
    manifest: Mapping[str, Any],
    target: Target,
    release: JetPackRelease,
    dla_core: int | None = None,
    strongly_typed: bool | None = None,
) -> dict[str, Any]:
    """The JSON-able engine build plan for one TensorRT release of a target.

    Args:
        model_path (Path): the ONNX model the engine is built from (as in the bundle).
        manifest (Mapping[str, Any]): manifest-like dict: ``precision`` (fp32|fp16|int8|mixed),
            ``max_batch``, optional ``inputs`` (full shapes for dynamic non-batch dims) and an
            optional ``engine`` table (``dla_core``, ``strongly_typed``, ``gpu_fallback``).
        target (Target): the board profile.
        release (JetPackRelease): the JetPack release (L4T, TensorRT) to plan for.
        dla_core (int | None): build for this DLA core (GPU fallback on). Defaults to the
            manifest's ``engine.dla_core``, else the GPU.
        strongly_typed (bool | None): strongly typed network on TensorRT 10.x. Defaults to the
            manifest's ``engine.strongly_typed``, else False; always True from TensorRT 11.

    Returns:
        dict: the plan (see the module docstring); deterministic for equal inputs.

    Raises:
        ModelError: no GPU on the target, unreadable model, a DLA request that cannot be met.
            (Dynamic non-batch dimensions without sizes do not raise: the plan lists them in
            ``unresolved_inputs`` and ``warnings``, and :func:`build_engine` refuses it.)
        RecipeError: bad precision or max_batch.
    """
    from cuvil_edge.packager.inspect import _dynamic_inputs, dla_available, optimization_profiles

    if not target.has_gpu:
        raise ModelError(f"target '{target.name}' has no NVIDIA GPU: it takes the ort-cpu format, "
                         "not a TensorRT engine")
    model_path = Path(model_path)
    if not model_path.is_file():
        raise ModelError(f"{model_path}: no such model file")
    precision = str(manifest.get("precision", "fp32"))
    if precision not in PRECISIONS:
        raise RecipeError(f"precision '{precision}' is not one of {', '.join(PRECISIONS)}")
    max_batch = manifest.get("max_batch", 1)
    if not isinstance(max_batch, int) or isinstance(max_batch, bool) or max_batch < 1:
        raise RecipeError(f"max_batch must be an integer >= 1, got {max_batch!r}")
    engine_opts = dict(manifest.get("engine") or {})
    if dla_core is None:
        dla_core = engine_opts.get("dla_core")
    if strongly_typed is None:
        strongly_typed = bool(engine_opts.get("strongly_typed", False))
    gpu_fallback = bool(engine_opts.get("gpu_fallback", True))

    trt = release.tensorrt
    major, minor = _mm(trt)
    facts = _model_facts(model_path)
    warnings: list[str] = []

    # ---- precision
    # Three-tier mixed precision (INT8 / FP16 / FP32 per layer group, from the packager's search).
    # TensorRT 10.x: FP16 + INT8 builder flags, FP32 layers pinned by per-layer precision. Strongly typed
    # (TensorRT 11): precision lives in the ONNX, so the builder casts the FP16 layers before parsing.
    tiers = manifest.get("layer_precisions") or {}
    layer_fp16 = sorted(tiers.get("fp16") or [])
    layer_fp32 = sorted(tiers.get("fp32") or [])
    typed = major >= 11 or bool(strongly_typed)
    network_flags: list[str] = []
    builder_flags: list[str] = []
    if major < 10:
        network_flags.append("EXPLICIT_BATCH")  # ONNX needs explicit batch on 8.x; default from 10
    if typed:
        mode = "strongly_typed"
        if major < 11:
            network_flags.append("STRONGLY_TYPED")
        if precision in ("fp16", "mixed") and not facts["has_fp16"] and not facts["has_qdq"]:
            warnings.append(f"precision {precision}, but the ONNX has no float16 tensors: a strongly "
                            "typed build runs it in FP32; convert the model to FP16 first")
        if precision in ("int8", "mixed") and not facts["has_qdq"]:
            warnings.append(f"precision {precision}, but the ONNX has no Q/DQ nodes: a strongly typed "
                            "build has no INT8; quantize the model first")
    else:
        mode = "builder_flags"
        if precision in ("fp16", "int8") or facts["has_fp16"] or layer_fp16:
            builder_flags.append("FP16")
        if precision in ("int8", "mixed") or facts["has_qdq"]:
            builder_flags.append("INT8")
        if layer_fp32 and "FP16" in builder_flags:
            # Layers the mixed search kept in FP32 must not be given FP16 kernels by the builder.
            builder_flags.append("OBEY_PRECISION_CONSTRAINTS")
        if precision in ("int8", "mixed") and not facts["has_qdq"]:
            warnings.append(f"precision {precision} without Q/DQ nodes: TensorRT {trt} would need an "
                            "INT8 calibrator; quantize the model to Q/DQ first")

    # ---- DLA
    dla = None
    if dla_core is not None:
        if not isinstance(dla_core, int) or isinstance(dla_core, bool) or dla_core < 0:
            raise ModelError(f"dla_core must be a core number >= 0, got {dla_core!r}")
        if dla_core >= target.dla_cores:
            raise ModelError(f"target '{target.name}' has {target.dla_cores} DLA core(s); "
                             f"core {dla_core} does not exist")
        if not dla_available(trt):
            raise ModelError(f"TensorRT {trt} places no layers on DLA (10.7 was the last 10.x with DLA, "
                             "11.0-11.4.0 have none); build for the GPU")
        if precision == "fp32" and not facts["has_fp16"] and not facts["has_qdq"]:
            raise ModelError("DLA runs FP16 or INT8 only; package with --precision fp16 or int8 for DLA")
        if facts["has_qdq"] and major < 11:
            warnings.append("explicit Q/DQ on DLA: TensorRT folds what it can into DLA INT8 scales; "
                            "the rest runs on the GPU (see cuvil-edge inspect)")
        dla = {"core": dla_core, "gpu_fallback": gpu_fallback}

    # ---- shapes
    dynamic = _dynamic_inputs(facts["model"])
    profiles, pwarn = optimization_profiles(dynamic, max_batch, _manifest_shapes(manifest), dla=dla is not None)
    profile = profiles["dla" if dla is not None else "gpu"]
    # Inputs whose dynamic non-batch sizes nobody gave: the plan is written (packaging goes on),
    # but build_engine refuses it until the recipe gives the input shape.
    unresolved = [d.name for d in dynamic if d.name not in profile]
    warnings.extend(pwarn)

    key = engine_cache_key(release.l4t, trt, target.gpu_sm, dla_core)
    from cuvil_edge import __version__

    plan = {
        "format": PLAN_FORMAT,
        "tool": f"cuvil-edge {__version__}",
        "target": target.name,
        "jetpack": release.jetpack,
        "l4t": release.l4t,
        "cuda": release.cuda,
        "tensorrt": trt,
        "tensorrt_major": major,
        "sm": target.gpu_sm,
        "model": {"path": str(manifest.get("model") or "model.onnx"), "sha256": _sha256(model_path),
                  "size": model_path.stat().st_size},
        "precision": precision,
        "precision_mode": mode,
        "network_flags": network_flags,
        "builder_flags": builder_flags,
        "workspace": {
            "bytes": workspace_bytes(target),
            "api": "set_memory_pool_limit" if (major, minor) >= (8, 4) else "max_workspace_size",
        },
        "max_batch": max_batch,
        "profiles": [profile] if profile else [],
        "unresolved_inputs": unresolved,
        "plugins": facts["plugins"],
        "layer_precisions": ({"fp32": layer_fp32} if not typed and layer_fp32 else {}),
        "fp16_casts": layer_fp16 if typed else [],
        "dla": dla,
        "timing_cache": f"timing_l4t-{release.l4t}_trt-{trt}_sm{target.gpu_sm}.cache",
        "engine_key": key.to_dict(),
        "engine_file": key.filename,
        "warnings": warnings,
    }
    plan["build_command"] = [
        "cuvil-edge", "engine", "build", "--plan", plan_member_name(plan), "--onnx", "model.onnx",
        "--out", f"engines/{key.filename}",
    ]
    plan["build_command"][6] = plan["model"]["path"]
    return plan


def make_build_plans(
    model_path: Path, manifest: Mapping[str, Any], target: Target, **kwargs: Any
) -> list[dict[str, Any]]:
    """One plan per distinct TensorRT version of ``target`` (see :func:`make_build_plan`).

    The packager writes each as :func:`plan_member_name` and lists it in the manifest's
    ``build_plans``. A DLA request is kept only for releases whose TensorRT has DLA.
    """
    from cuvil_edge.packager.inspect import dla_available

    if not target.has_gpu or not target.releases:
        raise ModelError(f"target '{target.name}' has no NVIDIA GPU (no TensorRT release): it takes the "
                         "ort-cpu format, not a TensorRT engine")
    plans = []
    seen = set()
    for release in target.releases:
        if release.tensorrt in seen:
            continue
        seen.add(release.tensorrt)
        kw = dict(kwargs)
        core = kw.get("dla_core", (manifest.get("engine") or {}).get("dla_core"))
        if core is not None and not dla_available(release.tensorrt):
            kw["dla_core"] = None
            manifest = {**manifest, "engine": {**(manifest.get("engine") or {}), "dla_core": None}}
        plans.append(make_build_plan(model_path, manifest, target, release, **kw))
    return plans


# ---------------------------------------------------------------------------------- builder


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
        plan (Mapping[str, Any]): a build plan (:func:`make_build_plan`).
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
        if _mm(have) != _mm(plan["tensorrt"]):
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
            config.set_timing_cache(cache, ignore_mismatch=False)
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
    if plan.get("unresolved_inputs"):
        raise ModelError(f"{plan_path}: input(s) {plan['unresolved_inputs']} have dynamic dimensions without "
                         "sizes, so the engine has no optimization profile; give the input shape in the recipe "
                         "and package again")
    onnx_path = Path(onnx_path)
    if not onnx_path.is_file():
        raise ModelError(f"{onnx_path}: no such model file")
    digest = _sha256(onnx_path)
    if digest != plan["model"]["sha256"]:
        raise ModelError(f"{onnx_path}: sha256 {digest[:16]}... is not the model the plan was made for "
                         f"({plan['model']['sha256'][:16]}...)")
    engine = EngineFromOnnx(onnx_path, plan, timing_cache, log=log)()
    atomic_write_bytes(Path(out_path), engine)
    return Path(out_path)
