"""Engines end to end against loopback devices: real sshd, real cuvil-edged, the CLI as a user runs it.

Each device is an sshd on 127.0.0.1 whose root shows a Jetson Orin Nano on JetPack 6.2 (L4T
36.4.3, TensorRT 10.3.0); its daemon runs with ``--engine-standin``. TensorRT is not installable
here, so the device build runs the STAND-IN builder (``--builder standin``) and the daemon's
stand-in runtime serves its engine with ONNX Runtime, reporting ``tensorrt-standin``; key
matching, transfer, host cache, sha256 and record checks, the daemon's choice and fallback,
SIGHUP swaps, rollback and Ctrl-C are the real code paths.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
from engine_harness import DEVICE_CLI, KEY_SLUG, REPO

from cuvil_edge.bundle.engine_store import EngineStore
from cuvil_edge.cli import main

pytestmark = pytest.mark.slow

CLI = " ".join(DEVICE_CLI)


def _config(daemon) -> dict:
    status, cfg = daemon.get("/v2/models/digits/config")
    assert status == 200, cfg
    return cfg


def _infer(daemon, x: np.ndarray) -> np.ndarray:
    body = json.dumps({"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.ravel().tolist()}]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{daemon.port}/v2/models/digits/infer", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        out = json.loads(r.read())["outputs"][0]
    return np.asarray(out["data"], np.float32).reshape(out["shape"])


def _expected(model_path, x):
    import onnxruntime as ort

    return ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]


def _wait(pred, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_build_once_upload_to_the_twin_refuse_mismatch_and_corruption(board, engine_bundles, engine_keys,
                                                                      host_cache, capsys, digits_model, tmp_path):
    a, b = board.device("a"), board.device("b")
    pub = str(engine_keys["public"])
    for dev in (a, b):
        assert main(["deploy", str(engine_bundles["v1"]), "--pub", pub, *board.args(dev)]) == 0
    capsys.readouterr()
    da, db = board.daemons["a"], board.daemons["b"]
    cfg = _config(da)
    assert cfg["backend"] == "onnxruntime" and cfg["engine_key"] == KEY_SLUG
    assert "no engine for key" in cfg["engine"]["reason"]

    # Two devices of the same key in one command (an inventory): the first builds, the second gets
    # the cached engine.
    inventory = tmp_path / "fleet.toml"
    lines = [f'[defaults]\nidentity = "{engine_keys["client"]}"\nknown_hosts = "{board.known_hosts}"\n']
    for dev in (a, b):
        lines.append(f'[[device]]\naddress = "root@127.0.0.1:{dev.port}"\nname = "{dev.name}"\n'
                     f'root = "{dev.root}"\nstore = "{dev.store}"\ndaemon_port = {board.daemons[dev.name].port}\n')
    inventory.write_text("\n".join(lines))
    assert main(["engine", "build", str(engine_bundles["v1"]), "--pub", pub, "--inventory", str(inventory),
                 "--builder", "standin", "--device-cli", CLI, "--json"]) == 0
    captured = capsys.readouterr()
    results = json.loads(captured.out)
    assert [r["device"] for r in results] == ["a", "b"]  # both at once; one lock per key
    first = next(r for r in results if r["status"] == "built")
    second = next(r for r in results if r is not first)
    assert (first["builds"], first["reloaded"], first["key"], first["builder"]) == (1, True, KEY_SLUG, "standin")
    assert first["bytes_received"] > 0
    assert "Timing layer" in captured.err  # the builder's log lines were shown as they came
    assert (second["status"], second["builds"], second["reloaded"], second["bytes_received"]) == \
        ("uploaded", 0, True, 0)
    assert second["bytes_sent"] >= (host_cache / KEY_SLUG / f"{first['model_sha256']}.plan").stat().st_size
    assert second["plan_sha256"] == first["plan_sha256"]
    outcomes = [first]

    x = np.random.default_rng(3).standard_normal((2, 1, 8, 8)).astype(np.float32)
    for daemon in (da, db):
        cfg = _config(daemon)
        assert (cfg["backend"], cfg["engine_key"], cfg["platform"]) == ("tensorrt-standin", KEY_SLUG,
                                                                        "onnxruntime_onnx")
        np.testing.assert_allclose(_infer(daemon, x), _expected(digits_model, x), rtol=1e-4, atol=1e-5)

    # Again: the device already has it.
    assert main(["engine", "build", str(engine_bundles["v1"]), "--pub", pub, *board.args(b, "--on"),
                 "--builder", "standin", "--device-cli", CLI, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["status"] == "present"

    assert main(["status", *board.args(a), "--json"]) == 0
    model = json.loads(capsys.readouterr().out)[0]["models"][0]
    assert (model["backend"], model["engine_key"]) == ("tensorrt-standin", KEY_SLUG)

    # A retrained model (v2) deployed without a build, and model v1's engine copied to v2's name.
    assert main(["deploy", str(engine_bundles["v2"]), "--pub", pub, *board.args(a)]) == 0
    capsys.readouterr()
    engines = EngineStore(a.store / "engines")
    key_dir = a.store / "engines" / KEY_SLUG
    sha1 = outcomes[0]["model_sha256"]
    sha2 = _config(da)["engine"]["model_sha256"]
    assert sha2 != sha1
    for suffix in (".plan", ".json"):
        (key_dir / f"{sha2}{suffix}").write_bytes((key_dir / f"{sha1}{suffix}").read_bytes())
    os.kill(da.proc.pid, signal.SIGHUP)  # the engine appeared: SIGHUP re-chooses for the same version
    _wait(lambda: _config(da)["engine"]["refused"], what="the copied engine to be refused")
    cfg = _config(da)
    assert cfg["backend"] == "onnxruntime" and cfg["version_policy"]["specific"]["versions"] == ["2.0.0"]
    assert f"built from model sha256 {sha1[:12]}..., but the bundle's model is {sha2[:12]}...; refused" in \
        cfg["engine"]["reason"]
    assert _infer(da, x).shape == (2, 10)  # ONNX Runtime keeps serving v2
    assert main(["status", *board.args(a), "--json"]) == 0
    model = json.loads(capsys.readouterr().out)[0]["models"][0]
    assert model["backend"] == "onnxruntime" and "refused" in model["engine_reason"]

    # Rollback to v1: the daemon loads v1 and picks its matching engine again.
    assert main(["rollback", "digits", *board.args(a)]) == 0
    capsys.readouterr()
    cfg = _config(da)
    assert cfg["version_policy"]["specific"]["versions"] == ["1.0.0"] and cfg["backend"] == "tensorrt-standin"
    # SIGHUP swap to v2 (current link switched by hand, as a package manager might): ONNX Runtime,
    # the copied engine refused again; and back to v1 with its engine.
    link, tmp = a.store / "bundles/digits/current", a.store / "bundles/digits/current.new"
    for version, backend in (("2.0.0", "onnxruntime"), ("1.0.0", "tensorrt-standin")):
        tmp.symlink_to(version)
        os.replace(tmp, link)
        os.kill(da.proc.pid, signal.SIGHUP)
        _wait(lambda v=version: _config(da)["version_policy"]["specific"]["versions"] == [v], what="a SIGHUP swap")
        assert _config(da)["backend"] == backend

    # A corrupt engine: v1's plan damaged on the device, then a rollback-style reload. v1 keeps
    # serving, with ONNX Runtime, and says why.
    plan = key_dir / f"{sha1}.plan"
    assert engines.records() and plan.is_file()
    data = bytearray(plan.read_bytes())
    data[len(data) // 2] ^= 0xFF
    plan.write_bytes(bytes(data))
    os.kill(da.proc.pid, signal.SIGHUP)
    _wait(lambda: _config(da)["backend"] == "onnxruntime", what="the corrupt engine to be refused")
    cfg = _config(da)
    assert "corrupt engine refused" in cfg["engine"]["reason"] and cfg["version_policy"]["specific"]["versions"] == \
        ["1.0.0"]
    np.testing.assert_allclose(_infer(da, x), _expected(digits_model, x), rtol=1e-4, atol=1e-5)

    # engine build --on repairs it from the host cache (the device copy fails its sha256 check).
    assert main(["engine", "build", str(engine_bundles["v1"]), "--pub", pub, *board.args(a, "--on"),
                 "--builder", "standin", "--device-cli", CLI, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["status"] == "uploaded"
    assert _config(da)["backend"] == "tensorrt-standin"


def test_deploy_build_engines_and_ctrl_c_stops_the_device_build(board, engine_bundles, engine_keys, host_cache,
                                                               tmp_path, capsys):
    a = board.device("a")
    pub = str(engine_keys["public"])
    # deploy --build-engines: deploy, then build on the device and reload the daemon.
    assert main(["deploy", str(engine_bundles["v1"]), "--pub", pub, *board.args(a), "--build-engines",
                 "--engine-builder", "standin", "--device-cli", CLI]) == 0
    out = capsys.readouterr().out
    assert "built" in out and "PASSED" in out
    assert _config(board.daemons["a"])["backend"] == "tensorrt-standin"

    # Ctrl-C during a long device build (v2, nothing cached): the whole device process group stops.
    env = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1", "CUVIL_EDGE_ENGINE_CACHE": str(tmp_path / "c2")}
    slow_cli = f"env CUVIL_EDGE_STANDIN_SECONDS=600 {CLI}"  # a layer every 30 s
    cmd = [sys.executable, "-m", "cuvil_edge.cli", "engine", "build", str(engine_bundles["v2"]), "--pub", pub,
           *board.args(a, "--on"), "--builder", "standin", "--device-cli", slow_cli]
    # Ctrl-C as at a terminal: a test run started in the background by a non-interactive shell
    # inherits SIGINT ignored, and Python then never raises KeyboardInterrupt; give the CLI the default.
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen: list[str] = []
    pgid = None
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if "pgid" in line and pgid is None:
                pgid = int(line.split("pgid", 1)[1].split()[0])
            if "Finished parsing network model" in line:  # streamed while the device build runs
                break
        assert pgid is not None and any("Finished parsing" in ln for ln in seen), "".join(seen)
        def group_gone():
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return True
            return False

        t_int = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        # The device build (the CLI and the stand-in builder in its group) is gone well before the
        # stand-in's next log line (30 s away), so the kill, not a broken pipe, ended it.
        _wait(group_gone, 20, "the device build's process group to exit")
        assert time.monotonic() - t_int < 25
        rest, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0, rest
    key_dir = a.store / "engines" / KEY_SLUG
    assert len(list(key_dir.glob("*.plan"))) == 1  # only v1's engine
    assert not (a.store / "engines" / ".build").exists() or not list((a.store / "engines" / ".build").iterdir())
    assert not list((tmp_path / "c2").rglob("*.plan")) if (tmp_path / "c2").exists() else True


def test_the_host_cache_never_hands_one_modules_engine_to_another(board, engine_bundles, engine_keys, host_cache,
                                                                   capsys):
    """An Orin Nano and an AGX Orin are both SM 8.7 on JetPack 6.2: the AGX gets its own build,
    never the Nano's cached engine or timing cache."""
    from engine_harness import bundle_key_slug

    nano, agx = board.device("nano", daemon=False), board.device("agx", daemon=False, kind="agx-orin-jp62")
    pub = str(engine_keys["public"])
    outcomes = []
    for dev in (nano, agx):
        assert main(["engine", "build", str(engine_bundles["v1"]), "--pub", pub, *board.args(dev, "--on"),
                     "--builder", "standin", "--device-cli", CLI, "--json"]) == 0
        outcomes.append(json.loads(capsys.readouterr().out)[0])
    assert [(o["status"], o["builds"]) for o in outcomes] == [("built", 1), ("built", 1)]
    assert outcomes[0]["key"] == KEY_SLUG and outcomes[1]["key"] == bundle_key_slug("agx-orin-16sm-64gb")
    assert sorted(p.name for p in host_cache.iterdir()) == sorted(o["key"] for o in outcomes)
    # The same again: each module now gets its own engine back (present), none crosses over.
    for dev, want in ((nano, outcomes[0]), (agx, outcomes[1])):
        assert main(["engine", "build", str(engine_bundles["v1"]), "--pub", pub, *board.args(dev, "--on"),
                     "--builder", "standin", "--device-cli", CLI, "--json"]) == 0
        again = json.loads(capsys.readouterr().out)[0]
        assert (again["status"], again["key"], again["plan_sha256"]) == ("present", want["key"], want["plan_sha256"])
