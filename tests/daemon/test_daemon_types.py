"""The daemon's seams are typed: mypy passes on ``cuvil_edge/daemon`` (with bundle and deploy) with the
checked-in config, and the objects the server wires together take the typed config and manifest, not
``Any``."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_mypy_passes_on_the_daemon_bundle_and_deploy():
    try:
        import mypy  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("mypy is not installed (the dev extra installs it)")
        pytest.skip("mypy is not installed (the dev extra installs it)")
    # No arguments: the checked-in config's files (cuvil_edge/bundle, daemon and deploy).
    res = subprocess.run([sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "Success" in res.stdout


@pytest.mark.parametrize("target, params", [
    ("cuvil_edge.daemon.resources:Resources", {"config": "Config"}),
    ("cuvil_edge.daemon.models:ModelRegistry", {"config": "Config"}),
    ("cuvil_edge.daemon.models:ModelInstance", {"manifest": "Manifest"}),
    ("cuvil_edge.daemon.grpc_server:GrpcFrontend", {"app": "App", "config": "Config"}),
    ("cuvil_edge.daemon.kserve:App", {"state": "ServerState"}),
    ("cuvil_edge.daemon.scheduler.memory:MemoryScheduler", {"target": "Target | None",
                                                            "kernel": "KernelMemory | None"}),
])
def test_seams_take_typed_objects(target, params):
    import importlib

    mod, _, name = target.partition(":")
    sig = inspect.signature(getattr(importlib.import_module(mod), name).__init__)
    got = {p: str(sig.parameters[p].annotation) for p in params}
    assert got == params


def test_the_scheduler_reads_no_raw_manifest_json():
    src = (REPO / "cuvil_edge" / "daemon" / "scheduler" / "memory.py").read_text()
    assert "json.loads" not in src and "import json" not in src
