"""Dynamic inputs and the optimization profiles (min/opt/max) a TensorRT engine needs for them.

A TensorRT engine built from a model with dynamic dimensions needs one profile per dynamic input:
the batch runs from 1 to the recipe's largest batch, other dynamic dimensions take the size the
recipe gives. DLA takes no dynamic shapes at all, so a DLA engine gets a fixed profile. The
inspect report shows these profiles; the engine build plans carry them to the board's builder.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import onnx

from cuvil_edge.errors import ModelError

__all__ = ["DynamicInput", "dynamic_inputs", "optimization_profiles"]


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


def optimization_profiles(
    dynamic: Sequence[DynamicInput],
    max_batch: int,
    shapes: Mapping[str, Sequence[int]] | None = None,
    dla: bool = False,
) -> tuple[dict[str, dict[str, dict[str, list[int]]]], list[str]]:
    """Optimization profiles for the dynamic inputs, and warnings for dimensions left open.

    The first dimension is the batch: min 1, opt and max ``max_batch`` (the daemon batches up to
    ``max_batch`` under load, the case worth tuning for). Other dynamic dimensions take their value
    from ``shapes`` (min = opt = max). The DLA profile fixes every dimension (DLA takes no dynamic
    shapes): batch ``max_batch``, partial batches padded by the runtime.

    Args:
        dynamic (Sequence[DynamicInput]): the dynamic inputs.
        max_batch (int): the recipe's largest batch.
        shapes (Mapping[str, Sequence[int]] | None): full shapes for inputs with dynamic
            non-batch dimensions (the batch entry is ignored). Defaults to None.
        dla (bool): also return a ``"dla"`` profile. Defaults to False.

    Returns:
        tuple: ``({"gpu": {...}, "dla": {...}}, warnings)``.
    """
    if max_batch < 1:
        raise ModelError(f"max_batch must be at least 1, got {max_batch}")
    shapes = shapes or {}
    gpu: dict[str, dict[str, list[int]]] = {}
    fixed: dict[str, dict[str, list[int]]] = {}
    warnings: list[str] = []
    for d in dynamic:
        given = list(shapes.get(d.name, []))
        lo, opt, hi = [], [], []
        open_dims = []
        for axis, size in enumerate(d.shape):
            if axis == 0 and size < 0:
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
            names = ", ".join(f"{a} ('{d.dim_names[a]}')" for a in open_dims)
            warnings.append(f"input '{d.name}': dynamic dimension(s) {names} have no size; give the "
                            f"input shape in the recipe so the engine gets a profile")
            continue
        gpu[d.name] = {"min": lo, "opt": opt, "max": hi}
        fixed[d.name] = {"min": list(hi), "opt": list(hi), "max": list(hi)}
    profiles: dict[str, dict[str, dict[str, list[int]]]] = {"gpu": gpu}
    if dla:
        profiles["dla"] = fixed
    return profiles, warnings
