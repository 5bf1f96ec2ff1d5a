"""A call recorder that stands in for the ``tensorrt`` module in the engine-builder tests.

It is NOT TensorRT and builds nothing. It exposes only the documented names
``EngineFromOnnx`` touches (``Logger``, ``Builder``, ``OnnxParser``, ``BuilderFlag``,
``NetworkDefinitionCreationFlag``, ``MemoryPoolType``, ``DeviceType``) and records every call and
attribute assignment, in order, so a test can check which API calls the TensorRT 8/10 (builder
flags) and 11 (strongly typed) paths make. Its TensorRT 11 flavour has no ``BuilderFlag.FP16``
or ``INT8``, as in the real 11.x Python API, so touching them fails the test.
"""

from __future__ import annotations

import types
from typing import Any

# What each factory method returns, by recorder name.
_CHILD = {
    "builder.create_network": "network",
    "builder.create_builder_config": "config",
    "builder.create_optimization_profile": "profile",
    "config.create_timing_cache": "timing_cache",
    "config.get_timing_cache": "timing_cache",
}


class _Obj:
    def __init__(self, name: str, calls: list, returns: dict) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_calls", calls)
        object.__setattr__(self, "_returns", returns)

    def __getattr__(self, attr: str) -> Any:
        full = f"{self._name}.{attr}"
        if full in self._returns and not callable(self._returns[full]):
            return self._returns[full]

        def method(*args: Any, **kwargs: Any) -> Any:
            self._calls.append((full, args, kwargs))
            ret = self._returns.get(full)
            if callable(ret):
                return ret(*args, **kwargs)
            return _Obj(_CHILD.get(full, attr), self._calls, self._returns)

        return method

    def __setattr__(self, attr: str, value: Any) -> None:
        self._calls.append((f"set {self._name}.{attr}", (value,), {}))


def make_tensorrt(version: str, parse_ok: bool = True, build_ok: bool = True,
                  cache_refused: bool = False) -> tuple[types.ModuleType, list]:
    """A recorder module reporting ``__version__ = version``; returns (module, calls).

    ``cache_refused``: ``config.set_timing_cache`` returns False for a non-empty cache, as
    TensorRT does for a cache made by another version or device.
    """
    calls: list = []
    major = int(version.split(".")[0])
    returns = {
        "parser.parse_from_file": lambda path: parse_ok,
        "parser.num_errors": 0 if parse_ok else 1,
        "parser.get_error": lambda i: "In node 3 (Unique): No importer registered for op: Unique",
        "builder.build_serialized_network": lambda net, cfg: b"serialized-by-recorder" if build_ok else None,
        "timing_cache.serialize": lambda: b"timing-bytes",
        "config.set_timing_cache": lambda cache, ignore_mismatch: not (cache_refused and cache_data[-1]),
        "config.create_timing_cache": lambda data: (cache_data.append(bytes(data)),
                                                     _Obj("timing_cache", calls, returns))[1],
    }
    cache_data: list[bytes] = []
    mod = types.ModuleType("tensorrt")
    mod.__version__ = version
    flags = {"GPU_FALLBACK": "BuilderFlag.GPU_FALLBACK"}
    if major < 11:
        flags.update(FP16="BuilderFlag.FP16", INT8="BuilderFlag.INT8")
    mod.BuilderFlag = types.SimpleNamespace(**flags)
    # STRONGLY_TYPED is new in TensorRT 10.0: the 8.x flavour lacks it, as the real 8.6 API does.
    net_flags = {"EXPLICIT_BATCH": 0} if major < 10 else {"EXPLICIT_BATCH": 0, "STRONGLY_TYPED": 1}
    mod.NetworkDefinitionCreationFlag = types.SimpleNamespace(**net_flags)
    mod.MemoryPoolType = types.SimpleNamespace(WORKSPACE="MemoryPoolType.WORKSPACE")
    mod.DeviceType = types.SimpleNamespace(DLA="DeviceType.DLA", GPU="DeviceType.GPU")

    class Logger:
        WARNING = "Logger.WARNING"

        def __init__(self, severity: str) -> None:
            calls.append(("Logger", (severity,), {}))

    def builder(logger: Any) -> _Obj:
        calls.append(("Builder", (), {}))
        return _Obj("builder", calls, returns)

    def onnx_parser(network: Any, logger: Any) -> _Obj:
        calls.append(("OnnxParser", (), {}))
        return _Obj("parser", calls, returns)

    mod.Logger = Logger
    mod.Builder = builder
    mod.OnnxParser = onnx_parser
    return mod, calls


def names(calls: list) -> list[str]:
    """The call names in order."""
    return [c[0] for c in calls]
