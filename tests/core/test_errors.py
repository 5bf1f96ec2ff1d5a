"""Every exception class of the package sits in the error tree drawn in ``cuvil_edge/errors.py``."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import cuvil_edge
from cuvil_edge import errors
from cuvil_edge.errors import CuvilEdgeError, DaemonError, DeployError, InternalError


def _exception_classes() -> dict[str, type[BaseException]]:
    """``module:Class`` -> class, for every exception class defined in the package."""
    found = {}
    for mod in pkgutil.walk_packages(cuvil_edge.__path__, "cuvil_edge."):
        module = importlib.import_module(mod.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == mod.name:
                found[f"{mod.name}:{name}"] = obj
    for name, obj in vars(errors).items():
        if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == errors.__name__:
            found[f"cuvil_edge.errors:{name}"] = obj
    return found


def test_the_walk_finds_the_classes_outside_errors_py():
    outside = {k for k in _exception_classes() if not k.startswith("cuvil_edge.errors:")}
    assert {"cuvil_edge.daemon.infer:BadRequest", "cuvil_edge.deploy.transport:Unreachable",
            "cuvil_edge.runtime.trt.tensorrt_import:TensorRTMissing"} <= outside
    assert len(outside) >= 11


def test_every_exception_derives_from_the_tree():
    stray = [k for k, cls in _exception_classes().items()
             if not issubclass(cls, (CuvilEdgeError, InternalError))]
    assert stray == [], "derive these from a class in cuvil_edge/errors.py"


def test_every_exception_is_drawn_in_the_tree():
    picture = errors.__doc__ or ""
    missing = [k for k, cls in _exception_classes().items() if cls.__name__ not in picture]
    assert missing == [], "add these to the tree in the docstring of cuvil_edge/errors.py"


@pytest.mark.parametrize(("where", "name", "base"), [
    ("cuvil_edge.daemon.kserve", "BadRequest", DaemonError),
    ("cuvil_edge.deploy.health", "DaemonHTTPFailure", DeployError),
    ("cuvil_edge.daemon.grpc_server", "RpcFailure", DaemonError),
])
def test_rebased_classes_keep_their_home_and_behaviour(where, name, base):
    cls = getattr(importlib.import_module(where), name)
    assert issubclass(cls, base)
    if name == "RpcFailure":
        import grpc

        exc = cls(grpc.StatusCode.NOT_FOUND, "message", (("k", "v"),))
        assert exc.code == grpc.StatusCode.NOT_FOUND and exc.trailing == (("k", "v"),) and str(exc) == "message"
        return
    exc = cls("message", 404) if name == "BadRequest" else cls(404, "message")
    assert exc.status == 404 and str(exc) == "message"


def test_a_plain_exception_is_caught_by_the_walk(monkeypatch):
    """The check is not vacuous: a class deriving from Exception alone is reported."""
    from cuvil_edge.telemetry import base

    class Planted(Exception):
        pass

    Planted.__module__ = base.__name__
    monkeypatch.setattr(base, "Planted", Planted, raising=False)
    with pytest.raises(AssertionError):
        test_every_exception_derives_from_the_tree()
