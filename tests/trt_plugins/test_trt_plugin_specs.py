"""TensorRT plugin glue: specs, shape rules, the shared arithmetic, and that every implementation
(Python plugin, C++ IPluginV3, CMake) uses the names the specs declare."""

from __future__ import annotations

import ast
import importlib.util
import re

import numpy as np
import pytest

from cuvil_edge.errors import ModelError
from cuvil_edge.trt_plugins import (
    PLUGINS,
    cpp_source_dir,
    get_plugin,
    kernels,
    output_shapes,
    plugin_op_names,
    register_python_plugins,
)

HAVE_TRT_PLUGIN = importlib.util.find_spec("tensorrt") is not None


class TestSpecs:
    def test_ids_and_lookup(self):
        assert [p.plugin_id for p in PLUGINS] == ["cuvil::normalize_u8", "cuvil::topk"]
        assert get_plugin("cuvil::topk") is get_plugin("topk")
        assert plugin_op_names() == {"normalize_u8", "topk"}
        with pytest.raises(ModelError, match="unknown cuvil-edge TensorRT plugin 'nms'"):
            get_plugin("nms")

    def test_normalize_shapes(self):
        mean, std = [127.0] * 3, [128.0] * 3
        assert output_shapes("normalize_u8", [(8, 224, 224, 3)], mean=mean, std=std) == [(8, 3, 224, 224)]
        assert output_shapes("normalize_u8", [(-1, 480, 640, 3)], mean=mean, std=std) == [(-1, 3, 480, 640)]
        with pytest.raises(ModelError, match="4D NHWC"):
            output_shapes("normalize_u8", [(224, 224, 3)], mean=mean, std=std)
        with pytest.raises(ModelError, match="one per channel"):
            output_shapes("normalize_u8", [(1, 4, 4, 4)], mean=mean, std=std)
        with pytest.raises(ModelError, match="std must not contain 0"):
            output_shapes("normalize_u8", [(1, 4, 4, 3)], mean=mean, std=[1.0, 0.0, 1.0])

    def test_topk_shapes(self):
        assert output_shapes("topk", [(-1, 1000)], k=5) == [(-1, 5), (-1, 5)]
        with pytest.raises(ModelError, match="exceeds the 10 classes"):
            output_shapes("topk", [(2, 10)], k=11)
        with pytest.raises(ModelError, match="at least 1"):
            output_shapes("topk", [(2, 10)], k=0)
        with pytest.raises(ModelError, match="takes 1 input"):
            output_shapes("topk", [(2, 10), (2, 10)], k=1)


class TestArithmetic:
    """The functions the Python plugins run with CuPy, here with numpy against references."""

    @pytest.mark.parametrize("shape", [(1, 1, 1, 1), (3, 17, 13, 3), (2, 224, 224, 3), (1, 5, 7, 4)])
    def test_normalize(self, shape):
        rng = np.random.default_rng(sum(shape))
        img = rng.integers(0, 256, shape, dtype=np.uint8)
        c = shape[3]
        mean, std = np.arange(c) * 10 + 100.0, np.arange(c) * 5 + 50.0
        out = np.empty((shape[0], c, shape[1], shape[2]), np.float32)
        kernels.normalize_u8(np, img, mean, std, out)
        ref = (img.astype(np.float64) - mean) / std
        np.testing.assert_allclose(out, ref.transpose(0, 3, 1, 2), rtol=1e-6, atol=1e-5)
        assert output_shapes("normalize_u8", [shape], mean=mean, std=std) == [out.shape]

    @pytest.mark.parametrize(("rows", "cols", "k"), [(1, 10, 1), (64, 1000, 5), (3, 127, 32)])
    def test_topk(self, rows, cols, k):
        logits = np.random.default_rng(cols).standard_normal((rows, cols)).astype(np.float32)
        values, idx = np.empty((rows, k), np.float32), np.empty((rows, k), np.int32)
        kernels.topk(np, logits, k, values, idx)
        for r in range(rows):
            ref = sorted(range(cols), key=lambda j: (-logits[r, j], j))[:k]
            assert idx[r].tolist() == ref
            np.testing.assert_array_equal(values[r], logits[r, ref])

    def test_topk_ties_keep_the_lower_index(self):
        logits = np.array([[1, 3, 3, 0, 3]], np.float32)
        values, idx = np.empty((1, 3), np.float32), np.empty((1, 3), np.int32)
        kernels.topk(np, logits, 3, values, idx)
        assert idx.tolist() == [[1, 2, 4]]


class TestImplementationsAgree:
    def test_python_plugin_module_imports_without_tensorrt(self):
        from cuvil_edge.trt_plugins import _python

        assert callable(_python.register)

    def test_python_plugin_registers_every_spec(self):
        tree = ast.parse((cpp_source_dir().parent / "_python.py").read_text())
        decorated = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                for dec in node.decorator_list:
                    if isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute):
                        decorated.setdefault(dec.func.attr, []).append(node.name)
        assert sorted(decorated["register"]) == ["normalize_u8_desc", "topk_desc"]
        assert sorted(decorated["impl"]) == ["normalize_u8_impl", "topk_impl"]
        # Descriptor signatures: inputs, then the spec's attributes, in order.
        funcs = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        for spec in PLUGINS:
            args = [a.arg for a in funcs[f"{spec.name}_desc"].args.args]
            assert args == [*spec.inputs, *spec.attrs], spec.plugin_id

    def test_cpp_plugin_uses_the_spec_names(self):
        src = cpp_source_dir()
        header = (src / "normalize_plugin.h").read_text()
        spec = get_plugin("normalize_u8")
        consts = dict(re.findall(r'constexpr char const\* (k\w+) = "([^"]*)";', header))
        assert consts["kNormalizeName"] == spec.name
        assert consts["kNormalizeVersion"] == spec.version
        assert consts["kNamespace"] == spec.namespace
        body = (src / "normalize_plugin.cpp").read_text()
        fields = set(re.findall(r'emplace_back\("(\w+)"', body))
        assert fields == set(spec.attrs)
        assert "class NormalizeU8Plugin : public nvinfer1::IPluginV3" in header
        lib = (src / "plugin_library.cpp").read_text()
        assert "getCreators(int32_t& nbCreators)" in lib and "setLoggerFinder" in lib

    def test_cmake_lists_every_source(self):
        src = cpp_source_dir()
        cmake = (src / "CMakeLists.txt").read_text()
        for f in sorted(p.name for p in src.iterdir() if p.suffix in (".cpp", ".cu")):
            assert f in cmake, f"{f} is not built by CMakeLists.txt"
        assert "-march=native" not in cmake and "native" not in re.findall(r"ARCHITECTURES\s+(\S+)", cmake)

    def test_kernel_limits_match_the_header(self):
        header = (cpp_source_dir() / "cuvil_kernels.h").read_text()
        assert int(re.search(r"kMaxChannels = (\d+)", header).group(1)) == 4
        assert int(re.search(r"kMaxTopK = (\d+)", header).group(1)) == 32


@pytest.mark.skipif(HAVE_TRT_PLUGIN, reason="checks the error raised where TensorRT is missing")
def test_register_without_tensorrt_says_what_to_install():
    with pytest.raises(ModelError, match=r"pip install cuvil-edge\[jetson\]"):
        register_python_plugins()


@pytest.mark.skipif(not HAVE_TRT_PLUGIN, reason="TensorRT not installable here")
def test_register_with_tensorrt():
    assert register_python_plugins() == ["cuvil::normalize_u8", "cuvil::topk"]
