"""Every model of the packager's real-model corpus starts and serves, with default options.

The bundles are the packager's own (``cuvil-edge package``, real data from the corpus locator,
``tests/packager/corpus.py``; Silero VAD's state input batches on axis 1 and its sample rate is a
scalar, as the manifest says). One daemon serves them all; stock tritonclient over HTTP and
gRPC sends each bundle's ``sample/inputs.npz`` and must get ``sample/expected.npz`` back (the
packager's emulation of the bundle) within the manifest's tolerances, for FP32 bundles of every
corpus model and INT8 bundles of those whose INT8 keeps the task on a CPU board (served with ONNX
Runtime's fused integer kernels, which round differently from the file's Q/DQ: CenterFace's was
refused at load before the packager's tolerance covered them). The VAD runs as a stream,
its state carried by the client, two streams interleaved, each equal to its own run by ONNX
Runtime (requests of different streams never batch together).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "packager"))
import corpus  # noqa: E402


def _daemon_helpers() -> ModuleType:
    """This folder's conftest as a module of its own name (several folders have a conftest.py)."""
    spec = importlib.util.spec_from_file_location("daemon_conftest", HERE / "conftest.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_h = _daemon_helpers()
Daemon, _run_ort = _h.Daemon, _h._run_ort

pytestmark = pytest.mark.slow

PACKAGED = ("nudenet-320n", "centerface", "ocr-det", "ocr-rec", "ocr-cls", "minilm", "magika", "silero-vad",
            "ddddocr-det", "mtcnn-onet")
# INT8 bundles too, where INT8 keeps the task on a CPU board (bench/results/packager_tasks.json):
# the daemon must give what the packager's exact Q/DQ emulation gave, not only FP32's answers.
PACKAGED_INT8 = ("centerface", "silero-vad", "mtcnn-onet")
SERVED = PACKAGED + tuple(f"{n}-int8" for n in PACKAGED_INT8)


def _samples(name: str) -> list[dict[str, np.ndarray]]:
    if name == "silero-vad":  # real frames of speech, the state each frame starts from, the rate
        frames = corpus.vad_frames(corpus.speech_audio())[40:46]
        return [{"input": f[None], "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)}
                for f in frames]
    if name == "minilm":
        return corpus.token_samples(6)
    if name == "magika":
        return corpus.magika_samples(6)
    return corpus.image_samples(name, 6)


def _package(name: str, out: Path, cli: Path, precision: str = "fp32") -> Path:
    served = name if precision == "fp32" else f"{name}-{precision}"
    data = out / f"{name}-data"
    if not data.exists():
        corpus.write_samples(data, _samples(name))
    bundle = out / f"{served}.cvb"
    res = subprocess.run([str(cli), "package", str(corpus.model_path(name)), "--target", "generic-arm64",
                          "--precision", precision, "--calib", str(data), "--name", served, "--out", str(bundle)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return bundle


@pytest.fixture(scope="module")
def corpus_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Path]]:
    tmp = tmp_path_factory.mktemp("corpus")
    store = tmp / "store"
    store.mkdir()
    cli = Path(sys.executable).with_name("cuvil-edge")
    from cuvil_edge.daemon.store import BundleStore

    s = BundleStore(store)
    for name in PACKAGED:
        s.install(_package(name, tmp, cli), allow_unsigned=True)
    for name in PACKAGED_INT8:
        s.install(_package(name, tmp, cli, "int8"), allow_unsigned=True)
    d = Daemon(store, tmp / "daemon.log")  # default options
    try:
        yield d.wait_ready(timeout=300), store
    finally:
        d.stop()


def _bundle_io(store: Path, name: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], tuple[float, float]]:
    from cuvil_edge.daemon.store import BundleStore

    s = BundleStore(store)
    m = s.manifest(name)
    d = s.path(name)
    with np.load(d / m.sample_member("sample_inputs")) as a, np.load(d / m.sample_member("sample_expected")) as b:
        return dict(a), dict(b), m.tolerances


def _infer(mod: object, client: object, name: str, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from tritonclient.utils import np_to_triton_dtype

    ins = []
    for k, v in feed.items():
        i = mod.InferInput(k, list(v.shape), np_to_triton_dtype(v.dtype))  # type: ignore[attr-defined]
        i.set_data_from_numpy(v)
        ins.append(i)
    res = client.infer(name, ins)  # type: ignore[attr-defined]
    meta = client.get_model_metadata(name)  # type: ignore[attr-defined]
    outs = meta["outputs"] if isinstance(meta, dict) else [{"name": o.name} for o in meta.outputs]
    return {o["name"]: res.as_numpy(o["name"]) for o in outs}


def test_every_corpus_model_is_ready_and_answers_as_the_packager_emulates(corpus_daemon):
    d, store = corpus_daemon
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    http, grpc = d.client(), d.grpc_client()
    index = {m["name"]: m for m in http.get_model_repository_index()}
    assert set(SERVED) <= set(index)
    assert all(m["state"] == "READY" for m in index.values()), [m for m in index.values() if m["state"] != "READY"]
    for name in SERVED:
        feed, expected, (rtol, atol) = _bundle_io(store, name)
        for mod, client in ((httpclient, http), (grpcclient, grpc)):
            got = _infer(mod, client, name, feed)
            for k, exp in expected.items():
                np.testing.assert_allclose(got[k], exp, rtol=rtol, atol=atol, err_msg=f"{name} {k} {mod.__name__}")
    assert "ERROR" not in d.log and "Traceback" not in d.log


def test_streaming_vad_carries_the_clients_state_and_never_mixes_streams(corpus_daemon):
    d, _ = corpus_daemon
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    frames = corpus.vad_frames(corpus.speech_audio())
    a, b = frames[40:52], frames[200:212]  # two streams: speech and another stretch
    model = corpus.model_path("silero-vad")

    def local(stream: np.ndarray) -> list[float]:
        state, probs = np.zeros((2, 1, 128), np.float32), []
        for f in stream:
            out = _run_ort(model, {"input": f[None], "state": state, "sr": np.array(16000, np.int64)})
            state = out["stateN"]
            probs.append(float(out["output"][0, 0]))
        return probs

    from concurrent.futures import ThreadPoolExecutor

    def served(mod: object, client: object, stream: np.ndarray) -> list[float]:
        state, probs = np.zeros((2, 1, 128), np.float32), []
        for f in stream:
            out = _infer(mod, client, "silero-vad", {"input": f[None], "state": state, "sr": np.array(16000, np.int64)})
            state = out["stateN"]
            probs.append(float(out["output"][0, 0]))
        return probs

    want_a, want_b = local(a), local(b)
    assert max(want_a) - min(want_a) > 0.05 or max(want_b) - min(want_b) > 0.05  # the state matters
    with ThreadPoolExecutor(2) as pool:
        fa = pool.submit(served, httpclient, d.client(), a)
        fb = pool.submit(served, grpcclient, d.grpc_client(), b)
        got_a, got_b = fa.result(), fb.result()
    np.testing.assert_allclose(got_a, want_a, atol=1e-4)
    np.testing.assert_allclose(got_b, want_b, atol=1e-4)


def test_the_packagers_samples_are_stored_compressed(corpus_daemon):
    """``sample/*.npz`` are deflated (a YOLO bundle's images were 19 of its 23 MB stored raw)."""
    import zipfile

    from cuvil_edge.daemon.store import BundleStore

    _, store = corpus_daemon
    s = BundleStore(store)
    for name in SERVED:
        m = s.manifest(name)
        for member in (m.sample_member("sample_inputs"), m.sample_member("sample_expected")):
            with zipfile.ZipFile(s.path(name) / member) as z:
                assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_DEFLATED}, (name, member)
