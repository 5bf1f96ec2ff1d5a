"""Version helpers of the engine key, shared by the host's packager and the board's runtime.

An engine is only valid for the module (device-tree model, SM count, memory), L4T, TensorRT, GPU
SM, DLA core and build plan it was built with; its key is written in the bundle's build plans and in the engine store on the board (see
``docs/bundle-format.md``). Host and board must read TensorRT and L4T versions the same way, so the
parsing lives here, in the bundle contract, below both the packager and the runtime: the runtime
no longer imports the packager to compare a plan's TensorRT version with the one it runs.

The key itself (:class:`EngineKey`, :func:`engine_cache_key`) lives here too, so the engine store
(:mod:`cuvil_edge.bundle.engine_store`), the runtime's engine choice and deploy all read one
definition.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cuvil_edge.errors import ModelError

__all__ = ["PLAN_HASH_FIELDS", "EngineKey", "engine_cache_key", "major_minor", "plan_digest", "version_tuple"]


def version_tuple(version: str) -> tuple[int, ...]:
    """The numeric parts of a version string: ``"10.3.0.30"`` -> ``(10, 3, 0, 30)``.

    A part without digits counts as 0 and letters inside a part are dropped (``"8.6.2-rc1"`` ->
    ``(8, 6, 21)``), so any version a board reports compares without raising.

    Args:
        version (str): a TensorRT, L4T or CUDA version.
    """
    parts = []
    for piece in str(version).split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def major_minor(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a version: engines and parser tables match on these two only.

    Args:
        version (str): a TensorRT or L4T version; missing parts count as 0 (``"10"`` -> ``(10, 0)``).
    """
    v = version_tuple(version) + (0, 0)
    return v[0], v[1]


# The plan fields that change what TensorRT builds; the plan hash in a key covers exactly these
# (not the model: engines are stored per model sha256 below the key; not names, tool or warnings).
PLAN_HASH_FIELDS = ("tensorrt", "precision", "precision_mode", "network_flags", "builder_flags", "workspace",
                    "max_batch", "profiles", "plugins", "layer_precisions", "fp16_casts", "dla")


def plan_digest(plan: Mapping[str, Any]) -> str:
    """12 hex digits of the sha256 of a plan's build-relevant fields (:data:`PLAN_HASH_FIELDS`).

    Repackaging with another precision, max batch or optimization profile changes it, so a key
    made with it never names an engine built from an older plan.

    Args:
        plan (Mapping[str, Any]): a build plan (``cuvil-engine-plan/1``).
    """
    import hashlib
    import json

    picked = {name: plan.get(name) for name in PLAN_HASH_FIELDS}
    text = json.dumps(picked, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class EngineKey:
    """What an engine is only valid for: module, L4T, TensorRT, GPU SM, DLA core and the plan.

    ``module`` names the board module (device-tree model, SM count, memory:
    ``orin-nano-8sm-8gb``, :attr:`cuvil_edge.targets.Target.module`): TensorRT picks tactics for
    the SM count and memory it sees, so an Orin Nano's engine is not an AGX Orin's although both
    are SM 8.7. ``plan`` is :func:`plan_digest` of the build plan (precision, profiles, max batch,
    flags). ``str(key)`` is the slug
    ``<module>_l4t-<l4t>_trt-<tensorrt>_sm<sm>_dla<core|none>_plan-<digest>``; engines and their
    timing cache live under ``<root>/<slug>/``.
    """

    module: str
    l4t: str
    tensorrt: str
    sm: str
    dla_core: int | None = None
    plan: str = ""

    @property
    def slug(self) -> str:
        dla = "none" if self.dla_core is None else str(self.dla_core)
        return f"{self.module}_l4t-{self.l4t}_trt-{self.tensorrt}_sm{self.sm}_dla{dla}_plan-{self.plan}"

    @property
    def filename(self) -> str:
        return f"{self.slug}.engine"

    def to_dict(self) -> dict[str, Any]:
        return {"module": self.module, "l4t": self.l4t, "tensorrt": self.tensorrt, "sm": self.sm,
                "dla_core": self.dla_core, "plan": self.plan}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EngineKey:
        try:
            core = data.get("dla_core")
            return engine_cache_key(str(data["module"]), str(data["l4t"]), str(data["tensorrt"]), str(data["sm"]),
                                    None if core is None else int(core), str(data["plan"]))
        except KeyError as exc:
            raise ModelError(f"engine key {dict(data)!r} lacks field {exc} (a key from before module and plan "
                             "were part of it: rebuild the engine)") from exc

    def __str__(self) -> str:
        return self.slug


def engine_cache_key(module: str, l4t: str, tensorrt: str, sm: str, dla_core: int | None = None,
                     plan: str = "") -> EngineKey:
    """The key of an engine built from plan ``plan`` by TensorRT ``tensorrt`` on L4T ``l4t`` for a module.

    Args:
        module (str): the module, e.g. ``"orin-nano-8sm-8gb"`` (:attr:`cuvil_edge.targets.Target.module`).
        l4t (str): L4T release, e.g. ``"36.4.3"``.
        tensorrt (str): TensorRT version, e.g. ``"10.3.0"``.
        sm (str): GPU compute capability, e.g. ``"8.7"``.
        dla_core (int | None): DLA core the engine targets, None for the GPU. Defaults to None.
        plan (str): :func:`plan_digest` of the build plan.

    Raises:
        ModelError: an empty or malformed part (it would make an ambiguous file name).
    """
    for field_name, value in (("module", module), ("l4t", l4t), ("tensorrt", tensorrt), ("sm", sm), ("plan", plan)):
        text = str(value).strip()
        if not text or any(ch in text for ch in "/_ \\") or text in (".", ".."):
            raise ModelError(f"engine key field {field_name}={value!r} must be a non-empty version string")
    if dla_core is not None and (not isinstance(dla_core, int) or dla_core < 0):
        raise ModelError(f"engine key dla_core={dla_core!r} must be a core number >= 0 or None")
    return EngineKey(str(module).strip(), str(l4t).strip(), str(tensorrt).strip(), str(sm).strip(), dla_core,
                     str(plan).strip())
