"""Issue #13, item 13 (and 14's reproduction): the packager's bad inputs end in one line.

Each case runs ``cuvil-edge`` as a user does: exit 1, one line on stderr naming the thing, no
traceback, and nothing written (no bundle, no directory created).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper


def _check(r, *needles: str) -> None:
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0, r.stderr
    for n in needles:
        assert n in r.stderr, r.stderr


def _tiny_model(path, *, external_to: str | None = None, no_inputs: bool = False):
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    if no_inputs:
        x = numpy_helper.from_array(np.ones((1, 4), np.float32), "x")
        graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w, x])
    else:
        graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if external_to is None:
        onnx.save(model, str(path))
        return path
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin",
              size_threshold=0)
    m = onnx.load(str(path), load_external_data=False)
    for init in m.graph.initializer:
        for entry in init.external_data:
            if entry.key == "location":
                entry.value = external_to
    onnx.save(m, str(path))
    return path


def _package(cli, model, out, keypair, *extra: str):
    return cli("package", str(model), "--target", "x86-host", "--out", str(out), "--key", str(keypair[0]),
               *extra, timeout=300)


class TestPackagerErrorLines:
    def test_external_data_outside_the_model_folder(self, cli, tmp_path, keypair):
        (tmp_path / "secret.bin").write_bytes(b"\0" * 64)
        folder = tmp_path / "m"
        folder.mkdir()
        model = _tiny_model(folder / "model.onnx", external_to="../secret.bin")
        out = tmp_path / "out" / "o.cvb"
        out.parent.mkdir()
        _check(_package(cli, model, out, keypair), "model.onnx", "outside")
        assert list(out.parent.iterdir()) == []

    def test_out_is_a_directory(self, cli, tmp_path, keypair, digits_model):
        out = tmp_path / "bundles"
        out.mkdir()
        _check(_package(cli, digits_model, out, keypair), "is a directory")
        assert list(out.iterdir()) == []

    def test_out_in_a_missing_directory(self, cli, tmp_path, keypair, digits_model):
        out = tmp_path / "missing" / "o.cvb"
        _check(_package(cli, digits_model, out, keypair), "does not exist")
        assert not out.parent.exists()

    def test_npy_header_claiming_1e11_samples(self, cli, tmp_path, keypair, digits_model):
        calib = tmp_path / "huge.npy"
        with open(calib, "wb") as f:
            np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False,
                                                     "shape": (100_000_000_000, 1, 8, 8)})
            f.write(b"\0" * 4096)
        out = tmp_path / "o.cvb"
        _check(_package(cli, digits_model, out, keypair, "--precision", "int8", "--calib", str(calib)),
               "huge.npy", "header claims")
        assert not out.exists()

    def test_npz_member_claiming_more_than_it_holds(self, tmp_path):
        import io
        import zipfile

        from cuvil_edge.errors import DataError
        from cuvil_edge.packager.data import InputSpec, load_dataset

        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False,
                                                   "shape": (100_000_000_000, 1, 8, 8)})
        with zipfile.ZipFile(tmp_path / "c.npz", "w") as z:
            z.writestr("input.npy", buf.getvalue() + b"\0" * 256)
        with pytest.raises(DataError, match="claims shape"):
            load_dataset(str(tmp_path / "c.npz"), [InputSpec("input", "float32", (-1, 1, 8, 8))], {}, 10)

    def test_model_with_no_inputs(self, cli, tmp_path, keypair):
        model = _tiny_model(tmp_path / "noin.onnx", no_inputs=True)
        out = tmp_path / "o.cvb"
        _check(_package(cli, model, out, keypair), "noin.onnx", "no inputs")
        assert ".npy" not in cli("package", str(model), "--target", "x86-host", "--out", str(out)).stderr
        assert not out.exists()

    def test_quantize_out_checks_too(self, cli, tmp_path, digits_model):
        out = tmp_path / "nowhere" / "q.onnx"
        _check(cli("quantize", str(digits_model), "--target", "x86-host", "--precision", "fp16", "--out", str(out)),
               "does not exist")
        assert not out.parent.exists()


@pytest.mark.parametrize("samples", [30, 80])
def test_int8_calibration_sample_counts(tmp_path, keypair, samples):
    """Sample counts that are not a multiple of the calibration batch package (they failed once)."""
    from cuvil_edge.packager.package import package
    from cuvil_edge.recipes import load_recipe

    recipe = load_recipe(Path(__file__).resolve().parents[2] / "recipes" / "digits-cnn-orin-nano.toml")
    recipe.target = "x86-host"
    recipe.calibration_samples = samples
    package(recipe, tmp_path / "o.cvb", keypair[0], enforce_goal=False)


def test_recipe_path_that_cannot_be_expanded_is_a_recipe_error(tmp_path):
    """Found by tests/fuzz/fuzz_recipe.py: '~nobody/...' raised RuntimeError out of pathlib."""
    from cuvil_edge.errors import RecipeError
    from cuvil_edge.recipes import recipe_from_dict

    for source in ("~no_such_user_zz/model.onnx", "models/a\x00b.onnx"):
        doc = {"name": "x", "model": {"source": source}, "target": {"board": "x86-host"}}
        with pytest.raises(RecipeError, match=r"r\.toml \[model\]: cannot use the path"):
            recipe_from_dict(doc, "r.toml", base=tmp_path)
