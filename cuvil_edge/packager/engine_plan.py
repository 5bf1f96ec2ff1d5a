"""Engine build plans: what the board's TensorRT builder is to do, written by the packager.

Engines are built where they run (docs/bundle-format.md): the packager writes one JSON *build plan*
per TensorRT version of the target into the bundle, and the device (or a host orchestrating a
remote build over SSH) turns ``plan + model.onnx`` into an engine keyed by module (device-tree
model, SM count, memory), L4T, TensorRT, SM, DLA core and the plan's digest
(:class:`~cuvil_edge.bundle.engine_key.EngineKey`). A plan says everything the builder needs:

* the precision mode: ``strongly_typed`` for TensorRT >= 11 (the FP16/INT8 builder flags and
  INT8 calibrators are gone; precision comes from the ONNX: Q/DQ with zero-point 0, FP16 casts)
  or when asked for on 10.x; ``builder_flags`` (``FP16``, ``INT8``) for TensorRT 8.x and 10.x;
* network creation flags (``EXPLICIT_BATCH`` on 8.x, ``STRONGLY_TYPED`` on 10.x when asked for;
  never on 8.x, which has no such flag);
* plugins: a model with plugin ops needs ``tensorrt.plugin`` (TensorRT >= 10.6); for an older
  TensorRT the plan is refused with the reason (no C++ ``IPluginV3`` library is shipped);
* ``trtexec_command`` on TensorRT 8.x and package-only (JetPack 4/5) plans: the same build by hand;
* the workspace limit from the board's RAM and the API that sets it;
* optimization profiles (min/opt/max per dynamic input, from the recipe's max batch);
* DLA core and GPU fallback, the timing cache name, the engine key and engine file name.

What a plan is made from is a :class:`PlanRequest`: the bundle's typed
:class:`~cuvil_edge.bundle.manifest.Manifest` (:meth:`PlanRequest.from_manifest`), or the
options of ``cuvil-edge engine plan``. The plan format and its check, and the engine key, are the
bundle contract's (:mod:`cuvil_edge.bundle.engine_plan`, :mod:`cuvil_edge.bundle.engine_key`);
the builder that reads a plan is :mod:`cuvil_edge.packager.engine_build`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuvil_edge.bundle.engine_key import engine_cache_key, major_minor, plan_digest
from cuvil_edge.bundle.engine_plan import PLAN_FORMAT
from cuvil_edge.bundle.engine_store import sha256_file
from cuvil_edge.bundle.manifest import Manifest
from cuvil_edge.errors import ModelError, RecipeError
from cuvil_edge.packager.dla_rules import dla_available
from cuvil_edge.packager.profiles import dynamic_inputs, optimization_profiles
from cuvil_edge.recipes import PRECISIONS
from cuvil_edge.targets import JetPackRelease, Target

__all__ = [
    "PlanRequest",
    "make_build_plan",
    "make_build_plans",
    "plan_member_name",
    "trtexec_command",
    "workspace_bytes",
]

# tensorrt.plugin (Python plugins) is new in TensorRT 10.6; JetPack 6.2 ships 10.3.
PYTHON_PLUGINS_SINCE = (10, 6)

_MIB = 1 << 20
_GIB = 1 << 30


@dataclass(frozen=True)
class PlanRequest:
    """What an engine plan is made from: precision, batch, shapes, per-layer tiers, engine options.

    Values are checked when a plan is made (:func:`make_build_plan`), with the same errors
    whether they came from a manifest, the command line or a dict.

    Attributes:
        precision (str): fp32, fp16, int8 or mixed.
        max_batch (int): the largest batch; sizes the optimization profiles.
        model (str): the model's member path in the bundle.
        input_shapes (Mapping[str, Any]): per input, a full shape whose every dimension is known
            (dynamic non-batch dimensions take their size from here) or a ``{min, opt, max}``
            profile as the packager resolved it.
        layer_fp16 (tuple[str, ...]): nodes the mixed-precision search put in FP16.
        layer_fp32 (tuple[str, ...]): nodes it kept in FP32.
        dla_core (int | None): build for this DLA core; None for the GPU.
        strongly_typed (bool): strongly typed network on TensorRT 10.x (always from 11).
        gpu_fallback (bool): let DLA layers fall back to the GPU.
    """

    precision: str = "fp32"
    max_batch: int = 1
    model: str = "model.onnx"
    input_shapes: Mapping[str, Any] = field(default_factory=dict)
    layer_fp16: tuple[str, ...] = ()
    layer_fp32: tuple[str, ...] = ()
    dla_core: int | None = None
    strongly_typed: bool = False
    gpu_fallback: bool = True

    @classmethod
    def from_manifest(
        cls,
        manifest: Manifest,
        layer_fp16: Sequence[str] = (),
        layer_fp32: Sequence[str] = (),
    ) -> PlanRequest:
        """The request a bundle's manifest makes: its precision, max batch, model and input shapes.

        Args:
            manifest (Manifest): the bundle's typed manifest.
            layer_fp16 (Sequence[str]): nodes the mixed search put in FP16. Defaults to none.
            layer_fp32 (Sequence[str]): nodes it kept in FP32. Defaults to none.
        """
        return cls(precision=manifest.precision, max_batch=manifest.max_batch, model=manifest.model or "model.onnx",
                   input_shapes=_fixed_shapes(manifest.inputs), layer_fp16=tuple(sorted(layer_fp16)),
                   layer_fp32=tuple(sorted(layer_fp32)))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> PlanRequest:
        """A request from manifest-shaped fields (scripts and tests written before the typed request).

        Reads ``precision``, ``max_batch``, ``model``, ``inputs``, ``layer_precisions`` (``fp16``,
        ``fp32``) and an ``engine`` table (``dla_core``, ``strongly_typed``, ``gpu_fallback``);
        absent fields take the defaults.
        """
        engine = dict(data.get("engine") or {})
        tiers = data.get("layer_precisions") or {}
        return cls(precision=str(data.get("precision", "fp32")), max_batch=data.get("max_batch", 1),
                   model=str(data.get("model") or "model.onnx"), input_shapes=_fixed_shapes(data.get("inputs") or []),
                   layer_fp16=tuple(sorted(tiers.get("fp16") or [])), layer_fp32=tuple(sorted(tiers.get("fp32") or [])),
                   dla_core=engine.get("dla_core"), strongly_typed=bool(engine.get("strongly_typed", False)),
                   gpu_fallback=bool(engine.get("gpu_fallback", True)))


def _fixed_shapes(inputs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per input, the profile the packager resolved (``profile``: min/opt/max), else its full shape
    when every dimension is a number (dynamic ones are names or -1)."""
    shapes: dict[str, Any] = {}
    for entry in inputs:
        shape = entry.get("shape") or []
        profile = entry.get("profile")
        if isinstance(profile, Mapping) and {"min", "opt", "max"} <= set(profile):
            shapes[str(entry["name"])] = {k: [int(d) for d in profile[k]] for k in ("min", "opt", "max")}
        elif shape and all(isinstance(d, int) for d in shape):
            shapes[str(entry["name"])] = [int(d) for d in shape]
    return shapes


def _as_request(request: PlanRequest | Manifest | Mapping[str, Any]) -> PlanRequest:
    if isinstance(request, PlanRequest):
        return request
    if isinstance(request, Manifest):
        return PlanRequest.from_manifest(request)
    return PlanRequest.from_mapping(request)


def workspace_bytes(target: Target) -> int:
    """Builder workspace limit: 1/8 of the board's RAM, between 256 MiB and 4 GiB.

    Jetson RAM is shared by the CPU, GPU and the OS, and the engine is built on the board
    beside the running daemon, so the builder gets a bounded slice rather than the whole GPU.
    """
    return int(min(4 * _GIB, max(256 * _MIB, target.ram_bytes // 8)))


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


def plan_member_name(plan: Mapping[str, Any]) -> str:
    """Bundle member path of a plan: ``engine/plan-trt<version>.json``."""
    return f"engine/plan-trt{plan['tensorrt']}.json"


def make_build_plan(
    model_path: Path,
    request: PlanRequest | Manifest | Mapping[str, Any],
    target: Target,
    release: JetPackRelease,
    dla_core: int | None = None,
    strongly_typed: bool | None = None,
) -> dict[str, Any]:
    """The JSON-able engine build plan for one TensorRT release of a target.

    Args:
        model_path (Path): the ONNX model the engine is built from (as in the bundle).
        request (PlanRequest | Manifest | Mapping[str, Any]): what to plan for: a
            :class:`PlanRequest`, the bundle's typed manifest, or manifest-shaped fields
            (:meth:`PlanRequest.from_mapping`).
        target (Target): the board profile.
        release (JetPackRelease): the JetPack release (L4T, TensorRT) to plan for.
        dla_core (int | None): build for this DLA core (GPU fallback on). Defaults to the
            request's ``dla_core``, else the GPU.
        strongly_typed (bool | None): strongly typed network on TensorRT 10.x. Defaults to the
            request's ``strongly_typed``, else False; always True from TensorRT 11.

    Returns:
        dict: the plan (see the module docstring); deterministic for equal inputs.

    Raises:
        ModelError: no GPU on the target, unreadable model, a DLA request that cannot be met.
            (Dynamic non-batch dimensions without sizes do not raise: the plan lists them in
            ``unresolved_inputs`` and ``warnings``, and :func:`build_engine` refuses it.)
        RecipeError: bad precision or max_batch.
    """
    req = _checked_request(model_path, request, target)
    model_path = Path(model_path)
    if dla_core is None:
        dla_core = req.dla_core
    if strongly_typed is None:
        strongly_typed = req.strongly_typed
    trt = release.tensorrt
    major, minor = major_minor(trt)
    facts = _model_facts(model_path)
    if facts["plugins"] and (major, minor) < PYTHON_PLUGINS_SINCE:
        raise ModelError(
            f"{model_path}: the model uses TensorRT plugin(s) {', '.join(facts['plugins'])}, but TensorRT {trt} "
            f"(JetPack {release.jetpack}) has no tensorrt.plugin (new in TensorRT "
            f"{'.'.join(map(str, PYTHON_PLUGINS_SINCE))}) and cuvil-edge ships no C++ IPluginV3 library compiled "
            f"against TensorRT {trt}'s headers; package for a JetPack whose TensorRT is >= "
            f"{'.'.join(map(str, PYTHON_PLUGINS_SINCE))}, or export the model without the plugin ops")
    warnings: list[str] = []
    prec = _precision_plan(req, trt, bool(strongly_typed), facts, warnings)
    dla = _dla_plan(dla_core, req, target, trt, facts, warnings)
    # Inputs whose dynamic non-batch sizes nobody gave: the plan is written (packaging goes on),
    # but build_engine refuses it until the recipe gives the input shape.
    dynamic = dynamic_inputs(facts["model"])
    profiles, pwarn = optimization_profiles(dynamic, req.max_batch, req.input_shapes, dla=dla is not None)
    profile = profiles["dla" if dla is not None else "gpu"]
    unresolved = [d.name for d in dynamic if d.name not in profile]
    warnings.extend(pwarn)

    from cuvil_edge import __version__

    plan: dict[str, Any] = {
        "format": PLAN_FORMAT,
        "tool": f"cuvil-edge {__version__}",
        "target": target.name,
        "module": target.module,
        "jetpack": release.jetpack,
        "l4t": release.l4t,
        "cuda": release.cuda,
        "tensorrt": trt,
        "tensorrt_major": major,
        "sm": target.gpu_sm,
        "model": {"path": req.model, "sha256": sha256_file(model_path),
                  "size": model_path.stat().st_size},
        "precision": req.precision,
        "precision_mode": prec["precision_mode"],
        "network_flags": prec["network_flags"],
        "builder_flags": prec["builder_flags"],
        "workspace": {
            "bytes": workspace_bytes(target),
            "api": "set_memory_pool_limit" if (major, minor) >= (8, 4) else "max_workspace_size",
        },
        "max_batch": req.max_batch,
        "profiles": [profile] if profile else [],
        "unresolved_inputs": unresolved,
        "plugins": facts["plugins"],
        "layer_precisions": prec["layer_precisions"],
        "fp16_casts": prec["fp16_casts"],
        "dla": dla,
        "warnings": warnings,
    }
    _name_the_engine(plan, target, release, dla_core)
    return plan


def _checked_request(model_path: Path, request: PlanRequest | Manifest | Mapping[str, Any],
                     target: Target) -> PlanRequest:
    """The request as a :class:`PlanRequest`, refused early: no GPU, no model, bad precision or batch."""
    if not target.has_gpu:
        raise ModelError(f"target '{target.name}' has no NVIDIA GPU: it takes the ort-cpu format, "
                         "not a TensorRT engine")
    if not Path(model_path).is_file():
        raise ModelError(f"{model_path}: no such model file")
    req = _as_request(request)
    if req.precision not in PRECISIONS:
        raise RecipeError(f"precision '{req.precision}' is not one of {', '.join(PRECISIONS)}")
    max_batch = req.max_batch
    if not isinstance(max_batch, int) or isinstance(max_batch, bool) or max_batch < 1:
        raise RecipeError(f"max_batch must be an integer >= 1, got {max_batch!r}")
    return req


def _precision_plan(req: PlanRequest, trt: str, strongly_typed: bool, facts: Mapping[str, Any],
                    warnings: list[str]) -> dict[str, Any]:
    """How the precision reaches TensorRT ``trt``: the plan's precision_mode, flags and per-layer tiers.

    Three-tier mixed precision (INT8 / FP16 / FP32 per layer group, from the packager's search).
    TensorRT 10.x: FP16 + INT8 builder flags, FP32 layers pinned by per-layer precision. Strongly
    typed (TensorRT 11): precision lives in the ONNX, so the builder casts the FP16 layers before
    parsing.
    """
    major, _ = major_minor(trt)
    precision = req.precision
    layer_fp16 = sorted(req.layer_fp16)
    layer_fp32 = sorted(req.layer_fp32)
    if strongly_typed and major < 10:
        # NetworkDefinitionCreationFlag.STRONGLY_TYPED is new in TensorRT 10.0 (8.6 has only
        # EXPLICIT_BATCH): asking 8.x for it is an AttributeError at build time.
        warnings.append(f"strongly typed networks need TensorRT >= 10; the plan for TensorRT {trt} uses "
                        "builder flags")
        strongly_typed = False
    typed = major >= 11 or strongly_typed
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
    return {"precision_mode": mode, "network_flags": network_flags, "builder_flags": builder_flags,
            "layer_precisions": ({"fp32": layer_fp32} if not typed and layer_fp32 else {}),
            "fp16_casts": layer_fp16 if typed else []}


def _dla_plan(dla_core: int | None, req: PlanRequest, target: Target, trt: str, facts: Mapping[str, Any],
              warnings: list[str]) -> dict[str, Any] | None:
    """The plan's ``dla`` entry (None: the GPU), refused where the board or TensorRT cannot meet it."""
    if dla_core is None:
        return None
    if not isinstance(dla_core, int) or isinstance(dla_core, bool) or dla_core < 0:
        raise ModelError(f"dla_core must be a core number >= 0, got {dla_core!r}")
    if dla_core >= target.dla_cores:
        raise ModelError(f"target '{target.name}' has {target.dla_cores} DLA core(s); "
                         f"core {dla_core} does not exist")
    if not dla_available(trt):
        raise ModelError(f"TensorRT {trt} places no layers on DLA (10.7 was the last 10.x with DLA, "
                         "11.0-11.4.0 have none); build for the GPU")
    if req.precision == "fp32" and not facts["has_fp16"] and not facts["has_qdq"]:
        raise ModelError("DLA runs FP16 or INT8 only; package with --precision fp16 or int8 for DLA")
    if facts["has_qdq"] and major_minor(trt)[0] < 11:
        warnings.append("explicit Q/DQ on DLA: TensorRT folds what it can into DLA INT8 scales; "
                        "the rest runs on the GPU (see cuvil-edge inspect)")
    return {"core": dla_core, "gpu_fallback": req.gpu_fallback}


def _name_the_engine(plan: dict[str, Any], target: Target, release: JetPackRelease, dla_core: int | None) -> None:
    """Add the engine's key (module, versions, DLA core, the plan's digest), file names and commands."""
    key = engine_cache_key(target.module, release.l4t, plan["tensorrt"], target.gpu_sm, dla_core, plan_digest(plan))
    plan["engine_key"] = key.to_dict()
    plan["engine_file"] = key.filename
    plan["timing_cache"] = f"{key.slug}.timing.cache"
    plan["build_command"] = [
        "cuvil-edge", "engine", "build", "--plan", plan_member_name(plan), "--onnx", plan["model"]["path"],
        "--out", f"engines/{key.filename}",
    ]
    if release.package_only or plan["tensorrt_major"] < 10:
        plan["trtexec_command"] = trtexec_command(plan)


def _dims(shape: Sequence[int]) -> str:
    return "x".join(str(int(d)) for d in shape)


def trtexec_command(plan: Mapping[str, Any]) -> list[str]:
    """The ``trtexec`` command line that builds the engine a plan describes, by hand on the board.

    For boards cuvil-edge cannot run on (JetPack 4 and 5: Python older than 3.10) and every
    TensorRT 8.x plan. Flags are trtexec's (``/usr/src/tensorrt/bin/trtexec`` on JetPack):
    ``--memPoolSize`` in MiB, shapes as ``name:1x3x224x224``; layers pinned to FP32 go through
    ``--precisionConstraints=obey --layerPrecisions``.

    Args:
        plan (Mapping[str, Any]): a build plan.
    """
    argv = ["/usr/src/tensorrt/bin/trtexec", f"--onnx={plan['model']['path']}",
            f"--saveEngine={plan.get('engine_file', 'model.engine')}",
            f"--timingCacheFile={plan.get('timing_cache', 'timing.cache')}",
            f"--memPoolSize=workspace:{int(plan['workspace']['bytes']) >> 20}"]
    if plan["precision_mode"] == "strongly_typed":
        argv.append("--stronglyTyped")
    flags = list(plan.get("builder_flags") or [])
    argv += [f"--{name.lower()}" for name in flags if name in ("FP16", "INT8")]
    pinned = (plan.get("layer_precisions") or {}).get("fp32") or []
    if pinned:
        argv += ["--precisionConstraints=obey", "--layerPrecisions=" + ",".join(f"{n}:fp32" for n in pinned)]
    for profile in plan.get("profiles") or []:
        for which in ("min", "opt", "max"):
            argv.append(f"--{which}Shapes=" + ",".join(f"{name}:{_dims(p[which])}" for name, p in profile.items()))
    dla = plan.get("dla")
    if dla:
        argv.append(f"--useDLACore={int(dla['core'])}")
        if dla.get("gpu_fallback", True):
            argv.append("--allowGPUFallback")
    return argv


def make_build_plans(
    model_path: Path, request: PlanRequest | Manifest | Mapping[str, Any], target: Target, **kwargs: Any
) -> list[dict[str, Any]]:
    """One plan per distinct TensorRT version of ``target`` (see :func:`make_build_plan`).

    The packager writes each as :func:`plan_member_name` and lists it in the manifest's
    ``build_plans``. A DLA request is kept only for releases whose TensorRT has DLA.
    """
    if not target.has_gpu or not target.releases:
        raise ModelError(f"target '{target.name}' has no NVIDIA GPU (no TensorRT release): it takes the "
                         "ort-cpu format, not a TensorRT engine")
    req = _as_request(request)
    plans = []
    seen = set()
    for release in target.releases:
        if release.tensorrt in seen:
            continue
        seen.add(release.tensorrt)
        kw = dict(kwargs)
        core = kw.get("dla_core", req.dla_core)
        if core is not None and not dla_available(release.tensorrt):
            kw["dla_core"] = None
            req = dataclasses.replace(req, dla_core=None)
        plans.append(make_build_plan(model_path, req, target, release, **kw))
    return plans


