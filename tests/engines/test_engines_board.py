"""The one real-TensorRT engine test: a Jetson over SSH builds, caches and serves a real engine.

Runs only against a board: set ``CUVIL_EDGE_HIL_BOARD=[user@]host[:port]`` (and, as for deploy,
``CUVIL_EDGE_IDENTITY`` / ``CUVIL_EDGE_KNOWN_HOSTS``) to a Jetson with JetPack, cuvil-edge (the
jetson extra) and a running ``cuvil-edged``. It deploys the digits bundle for the board's profile,
builds its engine with the board's TensorRT (``engine build --on``, no stand-in), and checks that
the daemon serves it as ``tensorrt`` with the outputs of ONNX Runtime on the host. Skipped
everywhere else (no board has been attached to this project yet).
"""

from __future__ import annotations

import json
import os

import pytest

BOARD = os.environ.get("CUVIL_EDGE_HIL_BOARD")

pytestmark = [pytest.mark.hil, pytest.mark.slow,
              pytest.mark.skipif(not BOARD, reason="no Jetson attached (set CUVIL_EDGE_HIL_BOARD=[user@]host[:port])")]


def test_real_engine_on_a_jetson(tmp_path, engine_keys, capsys, digits_model):
    from engine_harness import make_engine_bundle

    from cuvil_edge.cli import main

    bundle = make_engine_bundle(tmp_path / "digits.cvb", engine_keys["secret"], "1.0.0", digits_model)
    pub = str(engine_keys["public"])
    assert main(["deploy", str(bundle), "--pub", pub, "--to", BOARD]) == 0
    capsys.readouterr()
    assert main(["engine", "build", str(bundle), "--pub", pub, "--on", BOARD, "--json"]) == 0
    outcome = json.loads(capsys.readouterr().out)[0]
    assert outcome["builder"] == "tensorrt" and outcome["status"] in ("built", "uploaded", "present")
    assert main(["status", "--to", BOARD, "--json"]) == 0
    model = next(m for m in json.loads(capsys.readouterr().out)[0]["models"] if m["name"] == "digits")
    assert model["backend"] == "tensorrt" and model["engine_key"] == outcome["key"]
