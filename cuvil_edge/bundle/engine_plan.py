"""The engine build plan format (``cuvil-engine-plan/1``): what a bundle's ``engine/plan-*.json`` holds.

The packager writes plans (:func:`cuvil_edge.packager.engine_plan.make_build_plan`); the device-side
builder and deploy read and check them, so the format and its check live here, in the bundle
contract, below all three.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cuvil_edge.bundle.engine_key import EngineKey, major_minor, plan_digest
from cuvil_edge.errors import ModelError

__all__ = ["PLAN_FORMAT", "check_build_inputs", "load_plan", "validate_plan"]

PLAN_FORMAT = "cuvil-engine-plan/1"

_REQUIRED = ("format", "tensorrt", "l4t", "sm", "model", "precision_mode", "network_flags", "builder_flags",
             "workspace", "profiles", "engine_key", "engine_file", "timing_cache")


def validate_plan(plan: Mapping[str, Any], source: str = "plan") -> dict[str, Any]:
    """Check a plan's format and fields; returns it as a dict.

    Raises:
        ModelError: naming ``source`` and the missing or bad field.
    """
    if not isinstance(plan, Mapping):
        raise ModelError(f"{source}: an engine plan must be a JSON object")
    if plan.get("format") != PLAN_FORMAT:
        raise ModelError(f"{source}: format {plan.get('format')!r} is not {PLAN_FORMAT!r}")
    for name in _REQUIRED:
        if name not in plan:
            raise ModelError(f"{source}: field '{name}' is missing")
    if plan["precision_mode"] not in ("strongly_typed", "builder_flags"):
        raise ModelError(f"{source}: precision_mode {plan['precision_mode']!r} is unknown")
    if "STRONGLY_TYPED" in (plan["network_flags"] or []) and major_minor(str(plan["tensorrt"]))[0] < 10:
        raise ModelError(f"{source}: network flag STRONGLY_TYPED needs TensorRT >= 10, the plan is for "
                         f"{plan['tensorrt']}; package again")
    key = EngineKey.from_dict(plan["engine_key"])
    if key.plan != plan_digest(plan):
        raise ModelError(f"{source}: the plan's fields hash to {plan_digest(plan)}, its engine key says {key.plan}: "
                         "the plan was edited after packaging; package again")
    if key.filename != plan["engine_file"]:
        raise ModelError(f"{source}: engine_file {plan['engine_file']!r} does not match its key ({key.filename})")
    return dict(plan)


def load_plan(path: Path) -> dict[str, Any]:
    """Read and validate a plan file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise ModelError(f"{path}: no such plan file") from None
    except (OSError, ValueError) as exc:
        raise ModelError(f"{path}: not a JSON engine plan ({exc})") from exc
    return validate_plan(data, str(path))


def check_build_inputs(plan: Mapping[str, Any], plan_path: Path, onnx_path: Path) -> str:
    """The checks every engine build makes before TensorRT runs; returns the model's sha256.

    Both builds (``engine build --out``, ``packager/engine_build.py``, and into the store,
    ``packager/engine_device.py``) refuse the same inputs with the same error class and words.

    Raises:
        EngineError: the plan has inputs without sizes (no optimization profile), or the model is
            missing or not the one the plan was made for.
    """
    from cuvil_edge.bundle.engine_store import EngineError, sha256_file

    if plan.get("unresolved_inputs"):
        raise EngineError(f"{plan_path}: input(s) {plan['unresolved_inputs']} have dynamic dimensions without "
                          "sizes, so the engine has no optimization profile; give the input shape in the recipe "
                          "and package again")
    if not Path(onnx_path).is_file():
        raise EngineError(f"{onnx_path}: no such model file")
    digest = sha256_file(Path(onnx_path))
    if digest != plan["model"]["sha256"]:
        raise EngineError(f"{onnx_path}: sha256 {digest[:16]}... is not the model the plan was made for "
                          f"({plan['model']['sha256'][:16]}...)")
    return digest
