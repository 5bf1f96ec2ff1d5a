"""One inference core: admission, input checks, batch keys, top-k and accounting have one home.

HTTP (``kserve.py``) and gRPC (``grpc_server.py``) are codecs over ``daemon/infer.py``: this test
reads the daemon's sources and fails when one of those behaviours is defined or done a second
time, so a fix in one of them is made once.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import cuvil_edge.daemon as daemon_pkg

DAEMON = Path(daemon_pkg.__file__).parent
CODECS = ("kserve.py", "grpc_server.py", "http.py")

# behaviour -> (its one home, the function that does it)
HOMES = {
    "admission": ("infer.py", "admit_request"),
    "lookup with retry hints": ("infer.py", "lookup"),
    "input header checks": ("infer.py", "check_input_header"),
    "whole-request checks": ("infer.py", "complete_inputs"),
    "batch keys": ("infer.py", "batch_key"),
    "submission": ("infer.py", "enqueue"),
    "accounting": ("infer.py", "settle"),
    "classification extension": ("infer.py", "classify"),
    "BYTES serialization": ("infer.py", "serialize_bytes"),
    "top-k": ("pipeline.py", "top_k"),
}


def _modules() -> dict[str, ast.Module]:
    return {str(p.relative_to(DAEMON)): ast.parse(p.read_text()) for p in DAEMON.rglob("*.py")
            if "proto" not in p.parts}


def _defined(tree: ast.Module) -> set[str]:
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


@pytest.mark.parametrize("behaviour", sorted(HOMES))
def test_each_behaviour_is_defined_once(behaviour):
    home, fn = HOMES[behaviour]
    where = sorted(name for name, tree in _modules().items() if fn in _defined(tree))
    assert where == [home], f"{behaviour} ({fn}) is defined in {where}, its one home is {home}"


def test_front_ends_use_the_core_and_do_not_redo_its_work():
    mods = _modules()
    for codec in ("kserve.py", "grpc_server.py"):
        tree = mods[codec]
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "cuvil_edge.daemon.infer"
                    for a in n.names}
        assert {"InferenceCore", "check_input_header", "complete_inputs", "classify"} <= imported, (codec, imported)
        calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        # Accounting, batching, admission and top-k are the core's; a codec that does them itself
        # has grown a second copy.
        # (The server's own count of calls in progress, ``self.state.inflight``, is the transport's.)
        model_counts = [ast.unparse(n.target) for n in ast.walk(tree) if isinstance(n, ast.AugAssign)
                        and ast.unparse(n.target).endswith(".inflight")
                        and not ast.unparse(n.target).startswith("self.state.")]
        assert "record_request" not in attrs and not model_counts, (codec, model_counts)
        assert not {c for c in calls if c.endswith(("argsort", "argpartition", "Pending", "pressure"))}, (codec, calls)
        assert not any(c.endswith(".submit") for c in calls), codec


def test_resources_take_memory_refusal_from_the_core_not_the_http_app():
    tree = _modules()["resources.py"]
    sources = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "cuvil_edge.daemon.kserve" not in sources and "cuvil_edge.daemon.infer" in sources
