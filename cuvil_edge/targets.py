"""Board profiles: what the packager, kernels, daemon and deploy need to know about a target.

The figures live in ``data/targets.toml`` with the source of each; this module only loads and
checks them, so a new board is a data change.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from cuvil_edge._toml import loads_toml
from cuvil_edge.errors import TargetError

__all__ = ["BoardFigures", "JetPackRelease", "Target", "all_targets", "get_target", "host_target_name",
           "profile_for_device_tree"]

_ISAS = {"neon", "sve", "sve2", "sse4.2", "avx2"}


@dataclass(frozen=True)
class JetPackRelease:
    """One JetPack release: the L4T, TensorRT and CUDA versions it ships."""

    jetpack: str
    l4t: str
    tensorrt: str
    cuda: str
    python: str = ""  # the system Python of the release (TensorRT's apt bindings are built for it)

    @property
    def tensorrt_major(self) -> int:
        return int(self.tensorrt.split(".")[0])

    @property
    def package_only(self) -> bool:
        """True when cuvil-edge cannot run on the board itself: its Python is older than 3.10
        (JetPack 4 and 5), so bundles are packaged for it but the engine is built by hand with
        the plan's ``trtexec`` command line."""
        parts = [int(p) for p in self.python.split(".")[:2] if p.isdigit()]
        return bool(parts) and tuple(parts) < (3, 10)


@dataclass(frozen=True)
class BoardFigures:
    """Clock and power figures of a board (data sheet power-mode tables), ``clocks_power`` in the data.

    The telemetry simulator models a board from them; ``rails`` are named as that board's
    tegrastats names them, input rail first.
    """

    gpu_max_mhz: float
    cpu_max_mhz: float
    emc_max_mhz: float
    idle_mw: float
    max_mw: float
    rails: tuple[str, ...]  # input rail first, as that board's tegrastats names them
    gpu_util_reported: bool = True  # Thor's tegrastats prints GPC clocks without utilization


@dataclass(frozen=True)
class Target:
    """A board profile. ``has_gpu`` is False for CPU-only boards and the host."""

    name: str
    title: str
    arch: str
    cpu: str
    cpu_cores: int
    isa: tuple[str, ...]
    sve_vector_bytes: int
    ram_gb: float
    mem_type: str
    mem_bandwidth_gbs: float
    gpu: str
    gpu_sm: str
    integrated_gpu: bool
    dla_cores: int
    releases: tuple[JetPackRelease, ...]
    source: str
    figures: BoardFigures | None = field(default=None, compare=False)
    device_tree_model: str = field(default="", compare=False)  # in /proc/device-tree/model
    device_tree_min_ram_mb: int = field(default=0, compare=False)  # picks between variants of one model
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    gpu_sm_count: int = 0  # streaming multiprocessors: CUDA cores / cores per SM (128 Ampere/Blackwell, 64 Volta)

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpu_sm)

    @property
    def module(self) -> str:
        """The module an engine is built for: device-tree model, SM count and memory
        (``orin-nano-8sm-8gb``). TensorRT tunes kernels to the SM count and sizes tactics to
        memory, so two modules of one SM version (Orin Nano 8GB, AGX Orin 64GB) get different
        engines (see :class:`cuvil_edge.bundle.engine_key.EngineKey`)."""
        base = "-".join((self.device_tree_model or self.name).lower().split())
        ram = f"{self.ram_gb:g}".replace(".", "p")
        return f"{base}-{self.gpu_sm_count}sm-{ram}gb"

    @property
    def runtime_format(self) -> str:
        """``tensorrt`` for NVIDIA boards (symmetric Q/DQ), ``ort-cpu`` otherwise."""
        return "tensorrt" if self.has_gpu else "ort-cpu"

    @property
    def plugin_platform(self) -> str:
        """Folder name for native plugins in a bundle (``linux-aarch64`` / ``linux-x86_64``)."""
        return f"linux-{self.arch}"

    @property
    def ram_bytes(self) -> int:
        if self.ram_gb:
            return int(self.ram_gb * 1024**3)
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    @property
    def cores(self) -> int:
        return self.cpu_cores or (os.cpu_count() or 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "arch": self.arch,
            "cpu": self.cpu,
            "cpu_cores": self.cores,
            "isa": list(self.isa),
            "sve_vector_bytes": self.sve_vector_bytes,
            "ram_gb": self.ram_gb or round(self.ram_bytes / 1024**3, 1),
            "mem_bandwidth_gbs": self.mem_bandwidth_gbs,
            "gpu_sm": self.gpu_sm,
            "integrated_gpu": self.integrated_gpu,
            "dla_cores": self.dla_cores,
            "releases": [r.__dict__ for r in self.releases],
        }


def _require(board: str, raw: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    if key not in raw:
        raise TargetError(f"targets.toml: board '{board}' lacks field '{key}'")
    value = raw[key]
    if kind is float and isinstance(value, int):
        value = float(value)
    if not isinstance(value, kind):
        name = "number" if isinstance(kind, tuple) else kind.__name__
        raise TargetError(f"targets.toml: board '{board}' field '{key}' must be {name}")
    return value


def _figures(board: str, raw: Any) -> BoardFigures | None:
    if raw is None:
        return None
    where = f"{board}.clocks_power"
    if not isinstance(raw, dict):
        raise TargetError(f"targets.toml: board '{board}' field 'clocks_power' must be a table")
    numbers = {}
    for key in ("gpu_max_mhz", "cpu_max_mhz", "emc_max_mhz", "idle_mw", "max_mw"):
        value = _require(where, raw, key, (int, float))  # kept as written: 625 stays an int
        if isinstance(value, bool):
            raise TargetError(f"targets.toml: board '{where}' field '{key}' must be a number")
        numbers[key] = value
    if min(numbers.values()) < 0 or numbers["idle_mw"] > numbers["max_mw"]:
        raise TargetError(f"targets.toml: board '{where}': figures must be >= 0 and idle_mw <= max_mw")
    rails = _require(where, raw, "rails", list)
    if not rails or not all(isinstance(r, str) and r for r in rails):
        raise TargetError(f"targets.toml: board '{where}' field 'rails' must list rail names, input rail first")
    util = raw.get("gpu_util_reported", True)
    if not isinstance(util, bool):
        raise TargetError(f"targets.toml: board '{where}' field 'gpu_util_reported' must be bool")
    _require(where, raw, "source", str)
    return BoardFigures(**numbers, rails=tuple(rails), gpu_util_reported=util)


def _parse(data: dict[str, Any]) -> dict[str, Target]:
    releases: dict[str, JetPackRelease] = {}
    for jp, raw in data.get("jetpack", {}).items():
        releases[jp] = JetPackRelease(jp, str(raw["l4t"]), str(raw["tensorrt"]), str(raw["cuda"]),
                                      str(raw.get("python", "")))
    targets: dict[str, Target] = {}
    for name, raw in data.get("boards", {}).items():
        isa = tuple(_require(name, raw, "isa", list))
        unknown = set(isa) - _ISAS
        if unknown:
            raise TargetError(f"targets.toml: board '{name}' has unknown ISA {sorted(unknown)}")
        sve_bytes = _require(name, raw, "sve_vector_bytes", int)
        if ("sve" in isa) != (sve_bytes > 0):
            raise TargetError(f"targets.toml: board '{name}': sve_vector_bytes must be set iff SVE is listed")
        jps = []
        for jp in _require(name, raw, "jetpack", list):
            if jp not in releases:
                raise TargetError(f"targets.toml: board '{name}' names unknown JetPack '{jp}'")
            jps.append(releases[jp])
        targets[name] = Target(
            name=name,
            title=_require(name, raw, "title", str),
            arch=_require(name, raw, "arch", str),
            cpu=_require(name, raw, "cpu", str),
            cpu_cores=_require(name, raw, "cpu_cores", int),
            isa=isa,
            sve_vector_bytes=sve_bytes,
            ram_gb=_require(name, raw, "ram_gb", float),
            mem_type=_require(name, raw, "mem_type", str),
            mem_bandwidth_gbs=_require(name, raw, "mem_bandwidth_gbs", float),
            gpu=_require(name, raw, "gpu", str),
            gpu_sm=_require(name, raw, "gpu_sm", str),
            integrated_gpu=_require(name, raw, "integrated_gpu", bool),
            dla_cores=_require(name, raw, "dla_cores", int),
            releases=tuple(jps),
            source=_require(name, raw, "source", str),
            figures=_figures(name, raw.get("clocks_power")),
            device_tree_model=str(raw.get("device_tree_model", "")),
            device_tree_min_ram_mb=int(raw.get("device_tree_min_ram_mb", 0)),
            gpu_sm_count=int(raw.get("gpu_sm_count", 0)),
        )
        if targets[name].has_gpu and targets[name].gpu_sm_count <= 0:
            raise TargetError(f"targets.toml: board '{name}' has a GPU but no 'gpu_sm_count'")
    return targets


@functools.lru_cache(maxsize=1)
def all_targets() -> dict[str, Target]:
    """All board profiles by name, loaded once from the package data."""
    text = resources.files("cuvil_edge").joinpath("data/targets.toml").read_text("utf-8")
    return _parse(loads_toml(text))


def get_target(name: str) -> Target:
    """The profile named ``name``; raises TargetError listing the known names otherwise."""
    targets = all_targets()
    key = name.strip().lower().replace("_", "-")
    if key not in targets:
        raise TargetError(f"unknown target '{name}'; known targets: {', '.join(sorted(targets))}")
    return targets[key]


def profile_for_device_tree(model: str, ram_mb: int | None) -> str | None:
    """The profile whose ``device_tree_model`` occurs in ``model``, the variant chosen by RAM.

    Args:
        model (str): ``/proc/device-tree/model`` of a device, e.g. ``"NVIDIA Jetson Orin Nano
            Developer Kit"``.
        ram_mb (int | None): RAM the device reports; None picks the largest variant.

    Returns:
        The profile name, or None when no profile names this module.
    """
    groups: dict[str, list[Target]] = {}
    for target in all_targets().values():
        if target.device_tree_model and target.device_tree_model.lower() in model.lower():
            groups.setdefault(target.device_tree_model, []).append(target)
    for variants in groups.values():
        variants.sort(key=lambda t: t.device_tree_min_ram_mb, reverse=True)
        for target in variants:
            if ram_mb is None or ram_mb >= target.device_tree_min_ram_mb:
                return target.name
        return variants[-1].name
    return None


def host_target_name() -> str:
    """The profile that best describes the machine this runs on."""
    return "x86-host" if platform.machine() in ("x86_64", "AMD64") else "generic-arm64"
