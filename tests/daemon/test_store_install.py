"""``cuvil-edge store install``: a signed bundle goes into a local store, ``current`` switches, and
a running daemon serves the new version without a restart; a bad key or file changes nothing."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np


def _npz(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


def _cvb(tmp_path: Path, digits_model: Path, x: np.ndarray, version: str, key: Path) -> Path:
    import onnxruntime as ort

    from cuvil_edge.bundle import write_bundle

    want = ort.InferenceSession(str(digits_model)).run(None, {"input": x})[0]
    manifest = {"name": "digits", "version": version, "target": {"name": "x86-host", "arch": "x86_64"},
                "precision": "fp32", "format_kind": "ort-cpu", "model": "model.onnx",
                "inputs": [{"name": "input", "dtype": "float32", "shape": [-1, 1, 8, 8]}],
                "outputs": [{"name": "logits", "dtype": "float32", "shape": [-1, 10]}], "max_batch": 8,
                "validation": {"rtol": 1e-3, "atol": 1e-3}}
    out = tmp_path / f"digits-{version}.cvb"
    write_bundle(out, manifest, {"model.onnx": digits_model, "sample/inputs.npz": _npz(input=x),
                                 "sample/expected.npz": _npz(logits=want)}, key)
    return out


def test_store_install_switches_current_and_the_running_daemon_serves_it(tmp_path, digits_model, digits_data,
                                                                         keypair, cli, daemon_factory):
    sec, pub = keypair
    store = tmp_path / "store"
    store.mkdir()
    x = digits_data[:2]
    first = cli("store", "install", str(_cvb(tmp_path, digits_model, x, "1.0.0", sec)), "--store", str(store),
                "--pub", str(pub), "--daemon", "none")
    assert first.returncode == 0, first.stdout + first.stderr
    assert (store / "bundles" / "digits" / "current").resolve().name == "1.0.0"
    d = daemon_factory(store, "--pub", str(pub))
    assert d.client().get_model_metadata("digits")["versions"] == ["1.0.0"]

    res = cli("store", "install", str(_cvb(tmp_path, digits_model, x, "1.1.0", sec)), "--store", str(store),
              "--pub", str(pub), "--daemon", f"http://{d.url}")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "serves it now" in res.stdout
    assert (store / "bundles" / "digits" / "current").resolve().name == "1.1.0"
    assert d.client().get_model_metadata("digits")["versions"] == ["1.1.0"]  # no restart


def test_store_install_refuses_a_wrong_key_and_changes_nothing(tmp_path, digits_model, digits_data, keypair, cli):
    from cuvil_edge.bundle import generate_keypair

    sec, _ = keypair
    other_sec, other_pub = tmp_path / "o.key", tmp_path / "o.pub"
    generate_keypair(other_sec, other_pub)
    store = tmp_path / "store"
    store.mkdir()
    bundle = _cvb(tmp_path, digits_model, digits_data[:2], "1.0.0", sec)
    res = cli("store", "install", str(bundle), "--store", str(store), "--pub", str(other_pub), "--daemon", "none")
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert not (store / "bundles" / "digits").exists() or not any((store / "bundles" / "digits").iterdir())
    res = cli("store", "install", str(bundle), "--store", str(store), "--daemon", "none")
    assert res.returncode != 0 and "--pub" in res.stdout + res.stderr
