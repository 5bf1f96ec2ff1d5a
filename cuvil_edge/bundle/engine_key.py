"""Version helpers of the engine key, shared by the host's packager and the board's runtime.

An engine is only valid for the (L4T, TensorRT, GPU SM, DLA core) it was built with; its key is
written in the bundle's build plans and in the engine store on the board (see
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

__all__ = ["EngineKey", "engine_cache_key", "major_minor", "version_tuple"]


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


@dataclass(frozen=True)
class EngineKey:
    """What an engine is only valid for: L4T release, TensorRT version, GPU SM, DLA core.

    ``str(key)`` is the slug ``l4t-<l4t>_trt-<tensorrt>_sm<sm>_dla<core|none>``; engines are
    stored as ``engines/<slug>.engine`` in a bundle and under ``<cache>/<slug>/`` on a host.
    """

    l4t: str
    tensorrt: str
    sm: str
    dla_core: int | None = None

    @property
    def slug(self) -> str:
        dla = "none" if self.dla_core is None else str(self.dla_core)
        return f"l4t-{self.l4t}_trt-{self.tensorrt}_sm{self.sm}_dla{dla}"

    @property
    def filename(self) -> str:
        return f"{self.slug}.engine"

    def to_dict(self) -> dict[str, Any]:
        return {"l4t": self.l4t, "tensorrt": self.tensorrt, "sm": self.sm, "dla_core": self.dla_core}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EngineKey:
        try:
            core = data.get("dla_core")
            return engine_cache_key(str(data["l4t"]), str(data["tensorrt"]), str(data["sm"]),
                                    None if core is None else int(core))
        except KeyError as exc:
            raise ModelError(f"engine key {dict(data)!r} lacks field {exc}") from exc

    def __str__(self) -> str:
        return self.slug


def engine_cache_key(l4t: str, tensorrt: str, sm: str, dla_core: int | None = None) -> EngineKey:
    """The key of an engine built by TensorRT ``tensorrt`` on L4T ``l4t`` for SM ``sm``.

    Args:
        l4t (str): L4T release, e.g. ``"36.4.3"``.
        tensorrt (str): TensorRT version, e.g. ``"10.3.0"``.
        sm (str): GPU compute capability, e.g. ``"8.7"``.
        dla_core (int | None): DLA core the engine targets, None for the GPU. Defaults to None.

    Raises:
        ModelError: an empty or malformed part (it would make an ambiguous file name).
    """
    for field_name, value in (("l4t", l4t), ("tensorrt", tensorrt), ("sm", sm)):
        text = str(value).strip()
        if not text or any(ch in text for ch in "/_ \\") or text in (".", ".."):
            raise ModelError(f"engine key field {field_name}={value!r} must be a non-empty version string")
    if dla_core is not None and (not isinstance(dla_core, int) or dla_core < 0):
        raise ModelError(f"engine key dla_core={dla_core!r} must be a core number >= 0 or None")
    return EngineKey(str(l4t).strip(), str(tensorrt).strip(), str(sm).strip(), dla_core)
