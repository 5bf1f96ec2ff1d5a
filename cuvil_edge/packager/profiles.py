"""Dynamic inputs and the optimization profiles (min/opt/max) a TensorRT engine needs for them.

A TensorRT engine built from a model with dynamic dimensions needs one profile per dynamic input:
the batch (on the input's batch axis, not always the first: ``state [2, batch, 128]``) runs from 1
to the recipe's largest batch; other dynamic dimensions take the sizes the recipe gives
(``[input] shapes``: a shape, or ``{min, opt, max}``), or, for an image input, the pre-processing's
size. DLA takes no dynamic shapes at all, so a DLA engine gets a fixed profile. The inspect report
shows these profiles; the bundle's manifest and its engine build plans carry them to the board's
builder, and ``package`` refuses a TensorRT target whose dynamic dimensions have none
(:func:`missing_profile_message`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import onnx

from cuvil_edge.errors import ModelError

__all__ = ["DynamicInput", "dynamic_inputs", "missing_profile_message", "optimization_profiles", "profile_shapes"]


@dataclass(frozen=True)
class DynamicInput:
    """A graph input with dynamic dimensions: its shape (``-1`` where dynamic) and their names."""

    name: str
    shape: tuple[int, ...]
    dim_names: tuple[str, ...]

    @property
    def dynamic_axes(self) -> tuple[int, ...]:
        return tuple(i for i, d in enumerate(self.shape) if d < 0)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dim_names": list(self.dim_names),
                "dynamic_axes": list(self.dynamic_axes)}


def dynamic_inputs(model: onnx.ModelProto) -> list[DynamicInput]:
    """The graph inputs (initializers excepted) that have at least one dynamic dimension."""
    init = {t.name for t in model.graph.initializer}
    found = []
    for vi in model.graph.input:
        if vi.name in init:
            continue
        dims = vi.type.tensor_type.shape.dim
        shape = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in dims)
        names = tuple(d.dim_param if d.HasField("dim_param") else ("" if s > 0 else "?")
                      for d, s in zip(dims, shape))
        if any(s < 0 for s in shape):
            found.append(DynamicInput(vi.name, shape, names))
    return found


def _explicit(d: DynamicInput, prof: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
    """A ``{min, opt, max}`` profile given for ``d``, checked against the model's shape."""
    out = {k: [int(v) for v in prof[k]] for k in ("min", "opt", "max")}
    for k, shape in out.items():
        if len(shape) != len(d.shape):
            raise ModelError(f"[input] shapes.{d.name}.{k} {shape} has rank {len(shape)}; the model's "
                             f"input '{d.name}' {list(d.shape)} has rank {len(d.shape)}")
        for axis, (got, want) in enumerate(zip(shape, d.shape, strict=True)):
            if want > 0 and got != want:
                raise ModelError(f"[input] shapes.{d.name}.{k}: dimension {axis} is {got}, the model fixes it at {want}")
    return out


def optimization_profiles(
    dynamic: Sequence[DynamicInput],
    max_batch: int,
    shapes: Mapping[str, Any] | None = None,
    dla: bool = False,
    batch_axes: Mapping[str, int | None] | None = None,
) -> tuple[dict[str, dict[str, dict[str, list[int]]]], list[str]]:
    """Optimization profiles for the dynamic inputs, and warnings for dimensions left open.

    The batch axis (``batch_axes``, else the first) runs min 1, opt and max ``max_batch`` (the
    daemon batches up to ``max_batch`` under load, the case worth tuning for). Other dynamic
    dimensions take their value from ``shapes``: a full shape (min = opt = max), or an explicit
    ``{min, opt, max}`` profile used as given (its batch axis, when dynamic, still runs 1..max_batch). The DLA profile fixes every dimension (DLA takes no
    dynamic shapes) at the GPU profile's max, partial batches padded by the runtime.

    Args:
        dynamic (Sequence[DynamicInput]): the dynamic inputs.
        max_batch (int): the recipe's largest batch.
        shapes (Mapping[str, Any] | None): per input, a full shape (the batch entry is ignored) or
            a ``{"min", "opt", "max"}`` mapping of full shapes. Defaults to None.
        dla (bool): also return a ``"dla"`` profile. Defaults to False.
        batch_axes (Mapping[str, int | None] | None): per input its batch axis (None: none).
            Defaults to axis 0 for every input.

    Returns:
        tuple: ``({"gpu": {...}, "dla": {...}}, warnings)``.

    Raises:
        ModelError: an explicit profile whose rank or fixed dimensions disagree with the model.
    """
    if max_batch < 1:
        raise ModelError(f"max_batch must be at least 1, got {max_batch}")
    shapes = shapes or {}
    axes = batch_axes or {}
    gpu: dict[str, dict[str, list[int]]] = {}
    fixed: dict[str, dict[str, list[int]]] = {}
    warnings: list[str] = []
    for d in dynamic:
        entry = shapes.get(d.name)
        batch_axis = axes.get(d.name, 0)
        if isinstance(entry, Mapping):
            prof = _explicit(d, entry)
            if batch_axis is not None and d.shape[batch_axis] < 0:
                # The batch axis runs 1..max_batch whatever the shapes say (the daemon batches up to it).
                prof["min"][batch_axis], prof["opt"][batch_axis], prof["max"][batch_axis] = 1, max_batch, max_batch
            gpu[d.name] = prof
            fixed[d.name] = {k: list(prof["max"]) for k in ("min", "opt", "max")}
            continue
        given = list(entry or [])
        lo, opt, hi = [], [], []
        open_dims = []
        for axis, size in enumerate(d.shape):
            if axis == batch_axis and size < 0:
                lo.append(1)
                opt.append(max_batch)
                hi.append(max_batch)
            elif size < 0:
                if len(given) == len(d.shape) and int(given[axis]) > 0:
                    v = int(given[axis])
                    lo.append(v)
                    opt.append(v)
                    hi.append(v)
                else:
                    open_dims.append(axis)
            else:
                lo.append(size)
                opt.append(size)
                hi.append(size)
        if open_dims:
            warnings.append(missing_profile_message(d, open_dims))
            continue
        gpu[d.name] = {"min": lo, "opt": opt, "max": hi}
        fixed[d.name] = {"min": list(hi), "opt": list(hi), "max": list(hi)}
    profiles: dict[str, dict[str, dict[str, list[int]]]] = {"gpu": gpu}
    if dla:
        profiles["dla"] = fixed
    return profiles, warnings


def missing_profile_message(d: DynamicInput, open_dims: Sequence[int]) -> str:
    """What to write so input ``d``'s open dimensions get a profile: the recipe field and the flag."""
    names = ", ".join(f"{a} ('{d.dim_names[a]}')" if d.dim_names[a] not in ("", "?") else str(a) for a in open_dims)
    example = "x".join(str(s) if s > 0 else "N" for s in d.shape)
    return (f"input '{d.name}' {list(d.shape)}: dynamic dimension(s) {names} have no size for the TensorRT "
            f"profile; give [input] shapes = {{ {d.name} = {{ min = [...], opt = [...], max = [...] }} }} in "
            f"the recipe, or --input-shape {d.name}:{example} (N: sizes)")


def profile_shapes(
    dynamic: Sequence[DynamicInput],
    given: Mapping[str, Any] | None,
    preprocess: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The ``shapes`` for :func:`optimization_profiles`: the recipe's, else an image input's size
    from the pre-processing (``[preprocess] size`` on the H and W axes of its layout).

    Raises:
        ModelError: ``given`` names an input the model does not have as a dynamic input.
    """
    out: dict[str, Any] = dict(given or {})
    names = {d.name for d in dynamic}
    unknown = sorted(set(out) - names)
    if unknown:
        raise ModelError(f"[input] shapes.{unknown[0]}: the model has no dynamic input of that name "
                         f"(dynamic inputs: {', '.join(sorted(names)) or 'none'})")
    pre = preprocess or {}
    if pre.get("kind") == "image":
        h, w = pre["size"]
        hw_axes = (2, 3) if pre.get("layout", "NCHW") == "NCHW" else (1, 2)
        for d in dynamic:
            if d.name in out or len(d.shape) != 4:
                continue
            shape = list(d.shape)
            shape[hw_axes[0]] = h if shape[hw_axes[0]] < 0 else shape[hw_axes[0]]
            shape[hw_axes[1]] = w if shape[hw_axes[1]] < 0 else shape[hw_axes[1]]
            out[d.name] = shape
    return out
