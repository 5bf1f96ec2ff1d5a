"""Red-team round 3 (issue #26): finding 8 (malformed engine records) and the store symlinks of 9.

A record whose ``key`` is a list or a string, a ``1e400``, or deep nesting used to raise outside
the engine-error handling: the daemon exited 1 with no model served, and a repository load
answered "internal error (AttributeError)". A corrupt plan whose record hash matches (someone
rewrote both) must fall back to ONNX Runtime, and a plan or version directory reached through a
symlink out of the store is refused even when its hash matches. The engines are the stand-in
builder's (no TensorRT here) on a fake Orin Nano root.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from engine_harness import REPO, fake_board, make_engine_bundle

from cuvil_edge.bundle.engine_store import EngineStore, sha256_bytes
from cuvil_edge.errors import DaemonError
from cuvil_edge.packager.engine_device import build_into_store
from cuvil_edge.runtime.trt_select import choose_engine


@pytest.fixture()
def device(tmp_path, digits_model, engine_keys):
    from cuvil_edge.bundle import extract_bundle

    root = tmp_path / "root"
    fake_board(root, "orin-nano-jp62")
    bundle = make_engine_bundle(tmp_path / "b.cvb", engine_keys["secret"], "1.0.0", digits_model)
    bdir = tmp_path / "store/bundles/digits/1.0.0"
    manifest = extract_bundle(bundle, bdir, engine_keys["public"]).to_dict()
    rec = build_into_store(bdir / "engine/plan-trt10.3.0.json", digits_model, tmp_path / "store", str(root),
                           "standin", echo=lambda _line: None, standin_seconds=0.1)
    store = EngineStore(tmp_path / "store/engines")
    return {"root": str(root), "bundle_dir": bdir, "manifest": manifest, "store": tmp_path / "store",
            "record": store.record_path(rec.key, rec.model_sha256), "plan": store.plan_path(rec.key, rec.model_sha256)}


def _choose(d):
    return choose_engine(d["store"] / "engines", d["bundle_dir"], d["manifest"], root=d["root"], allow_standin=True)


def _bad_records(good: dict) -> dict[str, str]:
    return {
        "key-list": json.dumps({**good, "key": ["orin", "36.4.3"]}),
        "key-string": json.dumps({**good, "key": "orin-nano"}),
        "plan-size-1e400": json.dumps(good).replace(f'"plan_size": {good["plan_size"]}', '"plan_size": 1e400'),
        "deep-nesting": json.dumps({**good, "plugins": "X"}).replace('"X"', "[" * 20000 + "]" * 20000),
        "oversized": json.dumps({**good, "built_on": "x" * (1 << 20)}),
        "not-json": "{\"format\": ",
    }


@pytest.mark.parametrize("kind", ["key-list", "key-string", "plan-size-1e400", "deep-nesting", "oversized", "not-json"])
def test_finding8_malformed_engine_record_falls_back_and_is_quarantined(device, kind, caplog):
    assert _choose(device).backend == "tensorrt-standin"
    good = json.loads(device["record"].read_text())
    device["record"].write_text(_bad_records(good)[kind])
    choice = _choose(device)
    assert choice.backend == "onnxruntime" and choice.refused and "engine refused" in choice.reason, choice
    assert len(choice.reason) < 2000
    # Quarantined: the next load says "no engine yet" instead of refusing (and logging) again.
    assert device["record"].with_name(device["record"].name + ".bad").is_file()
    again = _choose(device)
    assert again.backend == "onnxruntime" and "no engine for key" in again.reason
    assert sum("engine record refused" in r.getMessage() for r in caplog.records) == 1


def test_finding9_plan_symlinked_out_of_the_store_is_refused(device, tmp_path):
    outside = tmp_path / "elsewhere.plan"
    shutil.copy(device["plan"], outside)
    device["plan"].unlink()
    device["plan"].symlink_to(outside)  # the same bytes: its hash matches the record
    choice = _choose(device)
    assert choice.backend == "onnxruntime" and "symlink" in choice.reason


def test_finding9_version_directory_symlinked_out_of_the_store_is_refused(device, tmp_path):
    from cuvil_edge.daemon.store import BundleStore

    outside = tmp_path / "outside-1.0.0"
    shutil.move(device["bundle_dir"], outside)
    device["bundle_dir"].symlink_to(outside)
    with pytest.raises(DaemonError, match="symlink or lies outside the store"):
        BundleStore(device["store"]).path("digits", "1.0.0")


def _daemon(store: Path, root: str, log: Path) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "cuvil_edge.daemon.main", "--store", str(store), "--root", root,
           "--engine-standin", "1", "--port", "0", "--grpc", "0"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = re.search(r"ready on (\S+)", log.read_text(errors="replace"))
        if m:
            return proc, m.group(1).rstrip(",")
        if proc.poll() is not None:
            raise AssertionError(f"daemon exited {proc.returncode}:\n{log.read_text()}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"daemon not ready:\n{log.read_text()}")


def _config(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/v2/models/digits/config", timeout=10) as r:
        return json.loads(r.read())


@pytest.mark.parametrize("damage", ["record-key-list", "plan-rewritten-with-its-hash"])
def test_finding8_bad_engine_never_stops_the_daemon(device, tmp_path, damage):
    if damage == "record-key-list":
        good = json.loads(device["record"].read_text())
        device["record"].write_text(json.dumps({**good, "key": ["x"]}))
    else:  # a corrupt plan whose record was rewritten to match it: the hash check passes
        data = bytearray(device["plan"].read_bytes())
        data[len(data) // 2:] = b"\0" * (len(data) - len(data) // 2)
        device["plan"].write_bytes(bytes(data))
        rec = json.loads(device["record"].read_text())
        rec.update(plan_sha256=sha256_bytes(bytes(data)), plan_size=len(data))
        device["record"].write_text(json.dumps(rec))
    log = tmp_path / "daemon.log"
    proc, url = _daemon(device["store"], device["root"], log)
    try:
        cfg = _config(url if url.startswith("http") else f"http://{url}")
        text = json.dumps(cfg)
        assert "onnxruntime" in text and ("engine refused" in text or "engine failed to load" in text), text
        assert " ERROR " not in log.read_text() and "Traceback" not in log.read_text()
    finally:
        proc.terminate()
        proc.wait(30)
