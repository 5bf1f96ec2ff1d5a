"""Host tests of cuvil_edge.sve: kernels against numpy references, argument checks, loading."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from cuvil_edge import sve
from cuvil_edge.errors import KernelError

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sve_kernel_cases as cases  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def _isas_to_collect() -> tuple[str, ...]:
    """The ISAs this CPU offers when the host library is built, else every ISA.

    Collection must not need the native library (``pytest --collect-only`` on a fresh checkout): without
    it every ISA is collected, the ``host_build`` fixture builds the library when a test runs, and a test
    of an ISA the CPU lacks skips.
    """
    try:
        return tuple(sve.cpu_info()["available"])
    except KernelError:
        return sve.ISAS


ISAS_TO_TEST = _isas_to_collect()


def available() -> list[str]:
    """The ISAs this CPU offers; call only in a test (the autouse fixture has built the library)."""
    return list(sve.cpu_info()["available"])


@pytest.fixture(autouse=True)
def _built(host_build):
    yield
    sve.select_isa(None)


@pytest.mark.parametrize("isa", ISAS_TO_TEST)
@pytest.mark.parametrize("case", cases.CASES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_case_matches_reference(case, isa, seed):
    if isa not in available():
        pytest.skip(f"this CPU lacks {isa}")
    sve.select_isa(isa)
    case(np.random.default_rng(seed))


class TestExports:
    def test_ops(self):
        assert set(sve.OPS) == {"normalize", "resize_normalize", "quantize", "dequantize", "softmax_topk", "nms"}


class TestValidation:
    img = np.zeros((4, 5, 3), np.uint8)

    @pytest.mark.parametrize("bad", [np.zeros((4, 5, 3), np.float32), np.zeros((4, 5), np.uint8),
                                     np.zeros((4, 5, 4), np.uint8), np.zeros((4, 10, 3), np.uint8)[:, ::2]])
    def test_normalize_rejects_bad_images(self, bad):
        with pytest.raises(KernelError, match="normalize"):
            sve.normalize(bad, 0, 1)

    def test_normalize_rejects_bad_out(self):
        with pytest.raises(KernelError, match="out must have shape"):
            sve.normalize(self.img, 0, 1, out=np.empty((3, 5, 4), np.float32))
        with pytest.raises(KernelError, match="float32"):
            sve.normalize(self.img, 0, 1, out=np.empty((3, 4, 5), np.float16))
        with pytest.raises(KernelError, match="C-contiguous"):
            sve.normalize(self.img, 0, 1, out=np.empty((3, 4, 10), np.float32)[:, :, ::2])

    def test_bad_parameters(self):
        with pytest.raises(KernelError, match="mean"):
            sve.normalize(self.img, [1, 2], 1)
        with pytest.raises(KernelError, match="std"):
            sve.normalize(self.img, 0, [1, np.inf, 1])
        with pytest.raises(KernelError, match="dtype"):
            sve.normalize(self.img, 0, 1, dtype=np.int8)
        with pytest.raises(KernelError, match="size"):
            sve.resize_normalize(self.img, (0, 4), 0, 1)
        with pytest.raises(KernelError, match="empty"):
            sve.resize_normalize(np.zeros((0, 4, 3), np.uint8), (2, 2), 0, 1)

    def test_quantize_checks(self):
        x = np.zeros((2, 3), np.float32)
        with pytest.raises(KernelError, match="float32"):
            sve.quantize(x.astype(np.float64), 0.1)
        with pytest.raises(KernelError, match="C-contiguous"):
            sve.quantize(np.zeros((3, 4), np.float32).T, 0.1)
        with pytest.raises(KernelError, match="axis="):
            sve.quantize(x, [0.1, 0.2, 0.3])
        with pytest.raises(KernelError, match="3 scales for axis 0"):
            sve.quantize(x, [0.1, 0.2, 0.3], axis=0)
        with pytest.raises(KernelError, match="positive"):
            sve.quantize(x, 0.0)
        with pytest.raises(KernelError, match="out of range"):
            sve.dequantize(x.astype(np.int8), 0.1, axis=2)

    def test_softmax_and_nms_checks(self):
        with pytest.raises(KernelError, match="k must be"):
            sve.softmax_topk(np.zeros((2, 3), np.float32), 4)
        with pytest.raises(KernelError, match="non-empty"):
            sve.softmax(np.zeros((2, 0), np.float32))
        with pytest.raises(KernelError, match=r"boxes must be \(N, 4\)"):
            sve.nms(np.zeros((3, 5), np.float32), np.zeros((3, 2), np.float32))
        with pytest.raises(KernelError, match="box_format"):
            sve.nms(np.zeros((3, 4), np.float32), np.zeros((3, 2), np.float32), box_format="xywh")
        with pytest.raises(KernelError, match="scores must be"):
            sve.nms(np.zeros((3, 4), np.float32), np.zeros((2, 2), np.float32))


class TestResults:
    def test_letterbox_geometry_and_padding(self):
        img = np.full((1080, 1920, 3), 200, np.uint8)
        lb = sve.letterbox_rect((1080, 1920), (640, 640))
        assert lb == sve.Letterbox(1 / 3, 0, 140, 640, 360)
        out = sve.resize_normalize(img, (640, 640), 0, 255, letterbox=True, pad_value=114)
        assert np.all(out[:, :140] == np.float32(114) * np.float32(1 / 255))
        assert np.all(out[:, 500:] == np.float32(114) * np.float32(1 / 255))
        assert np.all(out[:, 140:500] == np.float32(200) * np.float32(1 / 255))

    def test_resize_agrees_with_opencv(self):
        cv2 = pytest.importorskip("cv2")
        rng = np.random.default_rng(3)
        img = rng.integers(0, 256, (120, 160, 3), np.uint8)
        ours = sve.resize_normalize(img, (50, 70), 0, 1)
        ref = cv2.resize(img, (70, 50), interpolation=cv2.INTER_LINEAR).transpose(2, 0, 1).astype(np.float32)
        # OpenCV rounds its fixed-point result to uint8; we keep float32.
        assert np.abs(ours - ref).max() <= 1.0

    def test_nms_agrees_with_opencv(self):
        cv2 = pytest.importorskip("cv2")
        rng = np.random.default_rng(4)
        xy = rng.uniform(0, 500, (400, 2)).astype(np.float32)
        wh = rng.uniform(10, 120, (400, 2)).astype(np.float32)
        scores = rng.uniform(0, 1, (400, 1)).astype(np.float32)
        det = sve.nms(np.concatenate([xy, xy + wh], 1), scores, box_format="xyxy", score_threshold=0.25,
                      iou_threshold=0.45, max_detections=400)
        idx = cv2.dnn.NMSBoxes([list(map(float, b)) for b in np.concatenate([xy, wh], 1)],
                               scores[:, 0].tolist(), 0.25, 0.45)
        assert sorted(det.indices.tolist()) == sorted(np.asarray(idx).reshape(-1).tolist())

    def test_quantize_matches_onnxruntime(self):
        ort = pytest.importorskip("onnxruntime")
        from onnx import TensorProto, helper

        x = np.random.default_rng(5).uniform(-20, 20, (4, 3, 8, 8)).astype(np.float32)
        x[0, 0, 0, :4] = [0.25, 0.75, -0.25, 100.0]
        scale = np.array([0.5, 0.1, 0.03], np.float32)
        graph = helper.make_graph(
            [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=1)], "q",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
            [helper.make_tensor_value_info("q", TensorProto.INT8, x.shape)],
            [helper.make_tensor("s", TensorProto.FLOAT, [3], scale),
             helper.make_tensor("z", TensorProto.INT8, [3], [0, 0, 0])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 8
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        (want,) = sess.run(None, {"x": x})
        assert np.array_equal(sve.quantize(x, scale, axis=1), want)

    def test_kernels_release_the_gil(self):
        # ctypes drops the GIL around a foreign call unless the function carries
        # FUNCFLAG_PYTHONAPI (PyDLL); every kernel entry point must be a plain CDLL function.
        import ctypes

        from cuvil_edge.sve._library import get_library

        lib, _ = get_library()
        assert type(lib) is ctypes.CDLL
        for name in ("cuvil_normalize", "cuvil_resize_normalize", "cuvil_quantize", "cuvil_dequantize",
                     "cuvil_softmax_topk", "cuvil_nms"):
            assert not getattr(lib, name)._flags_ & ctypes._FUNCFLAG_PYTHONAPI, name
        # And threads really overlap: a second thread keeps running Python during a long call.
        img = np.random.default_rng(6).integers(0, 256, (2160, 3840, 3), np.uint8)
        ticks = []
        done = threading.Event()

        def spin():
            while not done.is_set():
                ticks.append(1)

        t = threading.Thread(target=spin)
        t.start()
        try:
            before = len(ticks)
            sve.normalize(img, 0, 255)
            during = len(ticks) - before
        finally:
            done.set()
            t.join()
        assert during > 100, f"only {during} Python steps ran beside the kernel: GIL held?"


    def test_threads_do_not_change_results(self):
        rng = np.random.default_rng(7)
        img = rng.integers(0, 256, (720, 1280, 3), np.uint8)
        x = rng.uniform(-5, 5, 1 << 20).astype(np.float32)
        single = (sve.normalize(img, 1, 2), sve.resize_normalize(img, (320, 320), 0, 255, letterbox=True),
                  sve.quantize(x, 0.03))
        sve.set_num_threads(3)
        try:
            assert sve.cpu_info()["threads"] == 3
            multi = (sve.normalize(img, 1, 2), sve.resize_normalize(img, (320, 320), 0, 255, letterbox=True),
                     sve.quantize(x, 0.03))
        finally:
            sve.set_num_threads(1)
        for a, b in zip(single, multi):
            assert np.array_equal(a, b)
        with pytest.raises(KernelError, match="threads"):
            sve.set_num_threads(0)


    def test_concurrent_callers_share_the_pool(self):
        rng = np.random.default_rng(8)
        imgs = [rng.integers(0, 256, (480, 640, 3), np.uint8) for _ in range(4)]
        want = [sve.resize_normalize(im, (320, 320), 0, 255) for im in imgs]
        got: dict[int, list] = {i: [] for i in range(4)}
        sve.set_num_threads(3)
        try:
            def work(i):
                for _ in range(5):
                    got[i].append(sve.resize_normalize(imgs[i], (320, 320), 0, 255))

            threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            assert not any(t.is_alive() for t in threads), "kernel calls hung"
        finally:
            sve.set_num_threads(1)
        for i in range(4):
            assert len(got[i]) == 5 and all(np.array_equal(g, want[i]) for g in got[i])

    def test_pool_survives_fork(self):
        code = (
            "import os, numpy as np\n"
            "from cuvil_edge import sve\n"
            "sve.set_num_threads(2)\n"
            "img = np.zeros((600, 800, 3), np.uint8)\n"
            "sve.normalize(img, 0, 1)\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    sve.normalize(img, 0, 1)\n"
            "    os._exit(0)\n"
            "_, status = os.waitpid(pid, 0)\n"
            "raise SystemExit(os.waitstatus_to_exitcode(status))\n"
        )
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
        assert p.returncode == 0, p.stderr


class TestLoading:
    def test_cpu_info(self):
        info = sve.cpu_info()
        assert info["platform"] == sve.current_platform()
        assert set(info["isa"]) == set(sve.OPS)
        assert "scalar" in info["available"]
        assert Path(info["library"]).is_file()

    def test_library_for(self, host_build, aarch64_build):
        assert sve.library_for("linux-x86_64" if sve.current_platform() == "linux-x86_64" else
                               "linux-aarch64").is_file()
        lib = sve.library_for("linux-aarch64")
        assert lib.read_bytes()[:4] == b"\x7fELF" and lib.read_bytes()[18] == 183  # EM_AARCH64
        with pytest.raises(KernelError, match="unknown kernel platform"):
            sve.library_for("windows-arm64")

    def test_load_from_bundle_directory(self, tmp_path):
        plat = sve.current_platform()
        dest = tmp_path / "bundle" / "plugins" / plat
        dest.mkdir(parents=True)
        shutil.copy(sve.library_for(plat), dest / sve.LIBRARY_NAME)
        try:
            info = sve.cpu_info(tmp_path / "bundle")
            assert info["library"] == str(dest / sve.LIBRARY_NAME)
            assert sve.normalize(np.zeros((1, 1, 3), np.uint8), 0, 1).shape == (3, 1, 1)
        finally:
            sve.load_library()
        with pytest.raises(KernelError, match="plugins/"):
            sve.load_library(tmp_path)

    def _python(self, code, **env):
        e = dict(os.environ, **env)
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, cwd=REPO,
                              timeout=60)

    def test_env_library_and_force_isa(self, tmp_path):
        plat = sve.current_platform()
        lib = tmp_path / sve.LIBRARY_NAME
        shutil.copy(sve.library_for(plat), lib)
        p = self._python("from cuvil_edge import sve; i = sve.cpu_info(); print(i['library'], i['isa']['nms'])",
                         CUVIL_SVE_LIBRARY=str(lib), CUVIL_FORCE_ISA="scalar")
        assert p.returncode == 0, p.stderr
        assert p.stdout.split() == [str(lib), "scalar"]

    @pytest.mark.parametrize("isa,msg", [("bogus", "not an ISA"), ("sve2", "lacks sve2")])
    def test_force_isa_refuses(self, isa, msg):
        if isa in available():
            pytest.skip(f"this CPU offers {isa}")
        p = self._python("from cuvil_edge import sve; sve.cpu_info()", CUVIL_FORCE_ISA=isa)
        assert p.returncode != 0
        assert "KernelError" in p.stderr and msg in p.stderr and "CUVIL_FORCE_ISA" in p.stderr

    def test_select_isa_refuses_missing(self):
        missing = [i for i in sve.ISAS if i not in available()]
        if not missing:
            pytest.skip("every ISA available")
        with pytest.raises(KernelError, match="lacks"):
            sve.select_isa(missing[-1])
