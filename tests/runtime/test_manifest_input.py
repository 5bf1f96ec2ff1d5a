"""The runtime reads manifests as a typed ``Manifest``, and still takes the daemon's dict (for now)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest

from cuvil_edge.bundle.manifest import FORMAT, Manifest
from cuvil_edge.runtime import load_backend
from cuvil_edge.runtime._manifest import as_manifest
from cuvil_edge.runtime.trt_select import backend_for_choice, bundle_model_sha256, choose_engine


def _full(model_sha: str = "ab" * 32, **extra) -> dict:
    return {"format": FORMAT, "name": "digits", "version": "2.0.0", "target": {"name": "x86-host"},
            "precision": "fp32", "format_kind": "ort-cpu", "model": "model.onnx",
            "inputs": [{"name": "input", "dtype": "float32", "shape": [-1, 1, 8, 8]}],
            "outputs": [{"name": "logits", "dtype": "float32", "shape": [-1, 10]}],
            "files": [{"path": "model.onnx", "sha256": model_sha, "size": 1}], **extra}


@pytest.fixture()
def bundle_dir(tmp_path: Path, digits_model: Path) -> Path:
    shutil.copy(digits_model, tmp_path / "model.onnx")
    return tmp_path


class TestAsManifest:
    def test_a_manifest_passes_through(self):
        m = Manifest.from_dict(_full())
        assert as_manifest(m) is m

    def test_a_valid_dict_is_parsed_by_the_bundle_module(self):
        m = as_manifest(_full(max_batch=4))
        assert isinstance(m, Manifest)
        assert (m.name, m.version, m.format_kind, m.max_batch) == ("digits", "2.0.0", "ort-cpu", 4)
        assert m.file("model.onnx").sha256 == "ab" * 32

    def test_a_hand_written_store_dict_reads_as_before(self):
        """A dict the bundle parser refuses (no ``files``, ``target`` or ``format``) keeps serving."""
        m = as_manifest({"name": "d", "version": "1", "format_kind": "tensorrt",
                         "engines": [{"key": {}, "path": "engines/x.engine"}, "junk"]})
        assert (m.name, m.version, m.format_kind, m.model, m.precision) == ("d", "1", "tensorrt", "model.onnx", "")
        assert m.engines == [{"key": {}, "path": "engines/x.engine"}] and m.files == [] and m.inputs == []
        empty = as_manifest({})
        assert (empty.name, empty.version, empty.model) == ("", "", "model.onnx")


class TestRuntimeTakesEitherForm:
    def test_load_backend_from_a_manifest_and_from_its_dict(self, bundle_dir: Path):
        m = Manifest.from_dict(_full())
        x = np.random.default_rng(0).random((2, 1, 8, 8), dtype=np.float32)
        outs = []
        for form in (m, m.to_dict()):
            backend = load_backend(bundle_dir, form)
            assert backend.kind == "ort" and backend.name == "digits:2.0.0"
            with backend:
                outs.append(backend.infer({"input": x})["logits"])
        np.testing.assert_array_equal(outs[0], outs[1])

    def test_model_sha256_comes_from_the_typed_file_entry(self, bundle_dir: Path):
        recorded = "cd" * 32
        assert bundle_model_sha256(bundle_dir, Manifest.from_dict(_full(recorded))) == recorded
        # Without a file entry (hand-written store) the model is hashed.
        actual = hashlib.sha256((bundle_dir / "model.onnx").read_bytes()).hexdigest()
        assert bundle_model_sha256(bundle_dir, {"model": "model.onnx"}) == actual

    def test_choose_engine_reads_the_typed_fields(self, bundle_dir: Path):
        choice = choose_engine(bundle_dir / "engines", bundle_dir, Manifest.from_dict(_full(precision="fp16")))
        assert (choice.backend, choice.precision) == ("onnxruntime", "fp16")
        assert "'ort-cpu' is not for TensorRT" in choice.reason
        cpu = choose_engine(bundle_dir / "engines", bundle_dir, Manifest.from_dict(_full(format_kind="tensorrt")),
                            device="cpu")
        assert cpu.reason == "daemon runs with --device cpu"

    def test_backend_for_choice_declares_the_manifest_specs(self, bundle_dir: Path):
        from cuvil_edge.runtime import BackendOptions
        from cuvil_edge.runtime.trt_select import EngineChoice

        engine = bundle_dir / "m.engine"
        engine.write_bytes(b"x" * 10)
        choice = EngineChoice(backend="tensorrt", engine_path=str(engine))
        backend = backend_for_choice(choice, Manifest.from_dict(_full()), BackendOptions())
        assert backend.kind == "tensorrt" and backend.name == "digits:2.0.0"
        assert [s.name for s in backend.inputs] == ["input"] and backend.outputs[0].shape == (-1, 10)
