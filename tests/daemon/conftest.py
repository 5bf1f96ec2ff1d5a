"""Fixtures for the serving tests: real bundles in a real store, the real daemon as a subprocess.

Models are real ONNX files: the lead's digits CNN (``cuvil_edge.models.build_digits_cnn``) and a
small 3-channel image classifier made here with ``onnx.helper`` for the image pre-processing path.
Bundle directories follow docs/bundle-format.md (manifest.json, model.onnx, sample/inputs.npz and
sample/expected.npz computed with ONNX Runtime).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def _run_ort(model: Path, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feed), strict=True))


def make_image_classifier(path: Path, classes: int = 4, seed: int = 0) -> Path:
    """A small ONNX classifier taking float32 [N,3,16,16] (normalized pixels) -> logits [N,classes]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3
    fc = rng.standard_normal((8, classes)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["input", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"], axis=1),
        helper.make_node("MatMul", ["f", "fc"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "imgcls",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 16, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(fc, "fc")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def make_bundle(dest: Path, model: Path, name: str, version: str, *, sample: np.ndarray | None = None,
                preprocess: dict[str, Any] | None = None, postprocess: dict[str, Any] | None = None,
                max_batch: int = 8, expected_offset: float = 0.0, latency_p95_ms: float | None = None) -> Path:
    """Write an extracted bundle directory by hand per docs/bundle-format.md and return it.

    ``expected_offset`` shifts sample/expected.npz: a non-zero value makes a bundle whose warm-up
    check fails (a "broken" version).
    """
    import onnx

    dest.mkdir(parents=True)
    shutil.copy(model, dest / "model.onnx")
    m = onnx.load(str(model))
    ins = [{"name": i.name, "dtype": "float32",
            "shape": [-1] + [d.dim_value for d in i.type.tensor_type.shape.dim[1:]]} for i in m.graph.input]
    outs = [{"name": o.name, "dtype": "float32",
             "shape": [-1] + [d.dim_value for d in o.type.tensor_type.shape.dim[1:]]} for o in m.graph.output]
    if sample is None:
        shape = [2] + ins[0]["shape"][1:]
        sample = np.random.default_rng(1).random(shape, dtype=np.float32)
    (dest / "sample").mkdir()
    feed = {ins[0]["name"]: sample}
    expected = _run_ort(model, feed)
    np.savez(dest / "sample" / "inputs.npz", **feed)
    np.savez(dest / "sample" / "expected.npz", **{k: v + expected_offset for k, v in expected.items()})
    manifest = {
        "format": "cuvil-bundle/1", "name": name, "version": version, "created": "2026-12-02T17:00:00Z",
        "tool": "tests", "target": {"name": "x86-host", "arch": "x86_64"}, "precision": "fp32",
        "format_kind": "ort-cpu", "model": "model.onnx", "inputs": ins, "outputs": outs,
        "max_batch": max_batch, "preprocess": preprocess or {"kind": "none"},
        "postprocess": postprocess or {"kind": "none"},
        "validation": {"sample_inputs": "sample/inputs.npz", "sample_expected": "sample/expected.npz",
                       "rtol": 1e-3, "atol": 1e-3},
        "engines": [], "build_plans": [], "plugins": {}, "files": [],
    }
    if latency_p95_ms is not None:
        manifest["latency_target_ms"] = {"p95": latency_p95_ms}
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return dest


def install(store: Path, bundle: Path, make_current: bool = True) -> None:
    """Copy a bundle directory into ``<store>/bundles/<name>/<version>`` and flip ``current``."""
    from cuvil_edge.daemon.store import BundleStore

    BundleStore(store).install(bundle, make_current=make_current, allow_unsigned=True)


@pytest.fixture(scope="session")
def digits_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from cuvil_edge.models import build_digits_cnn

    return build_digits_cnn(tmp_path_factory.mktemp("models") / "digits.onnx")


@pytest.fixture(scope="session")
def digits_data() -> np.ndarray:
    from sklearn.datasets import load_digits

    x = load_digits().images.astype(np.float32) / 16.0
    return x[:, None, :, :]


@pytest.fixture(scope="session")
def image_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_image_classifier(tmp_path_factory.mktemp("models") / "imgcls.onnx")


@pytest.fixture
def store(tmp_path: Path, digits_model: Path, digits_data: np.ndarray) -> Path:
    """A store holding digits 1.0.0 (current) with a classification post-process."""
    root = tmp_path / "store"
    root.mkdir()
    b = make_bundle(tmp_path / "src" / "digits-1.0.0", digits_model, "digits", "1.0.0",
                    sample=digits_data[:4], postprocess={"kind": "classification", "softmax": True, "top_k": 3})
    install(root, b)
    return root


class Daemon:
    """``cuvil-edged`` running as a subprocess, with its log in a file."""

    def __init__(self, store: Path, log: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.store = store
        self.log_path = log
        self.args = list(args)
        e = dict(os.environ)
        e.setdefault("CUVIL_EDGE_CACHE", str(Path.home() / ".cache" / "cuvil-edge"))
        e.update(env or {})
        cmd = [sys.executable, "-m", "cuvil_edge.daemon.main", "--store", str(store), *self.args]
        if "--uds" not in self.args and "--port" not in self.args:
            cmd += ["--port", "0"]
        if not {"--grpc", "--grpc-port", "--grpc-uds"} & set(self.args):
            cmd += ["--grpc-port", "0"]  # a free port: tests run side by side
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=REPO, env=e)
        self.url = ""
        self.grpc_url = ""
        self._clients: list[Any] = []

    def wait_ready(self, timeout: float = 60.0) -> Daemon:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log
            m = re.search(r"ready on (\S+)", text)
            if m:
                self.url = m.group(1).rstrip(",").replace("http://", "")
                g = re.search(r"grpc://(\S+?),? serving", text)
                self.grpc_url = g.group(1) if g else ""
                return self
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode} before ready:\n{text}")
            time.sleep(0.05)
        raise AssertionError(f"daemon not ready after {timeout} s:\n{self.log}")

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.url.rpartition(":")
        return host, int(port)

    def client(self, **kw: Any) -> Any:
        """A tritonclient HTTP client for this daemon, closed by ``stop`` if the test did not.

        tritonclient closes in ``__del__``, which joins a gevent pool; run by the cyclic collector
        in a thread without a gevent hub (any thread, any later test) that raises. Closing every
        client here, in the test's own thread, keeps ``__del__`` a no-op.
        """
        import tritonclient.http as httpclient

        c = httpclient.InferenceServerClient(self.url, **kw)
        self._clients.append(c)
        return c

    def grpc_client(self, **kw: Any) -> Any:
        """A tritonclient gRPC client (sync) for this daemon, closed by ``stop`` if the test did not."""
        import tritonclient.grpc as grpcclient

        c = grpcclient.InferenceServerClient(self.grpc_url, **kw)
        self._clients.append(c)
        return c

    def metrics(self) -> str:
        """The Prometheus text of ``GET /metrics``."""
        import http.client

        conn = http.client.HTTPConnection(*self.host_port, timeout=10)
        try:
            conn.request("GET", "/metrics")
            return conn.getresponse().read().decode()
        finally:
            conn.close()

    def rss_kb(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def send(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for c in self._clients:
            c.close()
        self._clients.clear()
        self._log.close()
        return self.proc.returncode


class LiveTegrastats(threading.Thread):
    """Appends ``line`` to a log every 0.1 s, as ``tegrastats --interval 100 --logfile`` does."""

    def __init__(self, path: Path, line: str) -> None:
        super().__init__(daemon=True)
        self.path, self.line = path, line
        self._stop_event = threading.Event()

    def run(self) -> None:
        with self.path.open("a") as fh:
            while not self._stop_event.wait(0.1):
                fh.write(self.line + "\n")
                fh.flush()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(5)


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    """Start daemons (``factory(store, *args, ready=True)``); all are stopped at teardown."""
    started: list[Daemon] = []

    def factory(store: Path, *args: str, ready: bool = True, env: dict[str, str] | None = None) -> Daemon:
        d = Daemon(store, tmp_path / f"daemon-{len(started)}.log", *args, env=env)
        started.append(d)
        return d.wait_ready() if ready else d

    yield factory
    for d in started:
        d.stop()


@pytest.fixture
def live_tegrastats(tmp_path: Path) -> Iterator[Callable[[str], LiveTegrastats]]:
    """Start a live tegrastats log (``factory(first_line)``; steer it by setting ``.line``); stopped at teardown."""
    started: list[LiveTegrastats] = []

    def factory(line: str) -> LiveTegrastats:
        path = tmp_path / f"tegrastats-{len(started)}.log"
        path.write_text("")
        writer = LiveTegrastats(path, line)
        started.append(writer)
        writer.start()
        return writer

    yield factory
    for writer in started:
        writer.stop()


@pytest.fixture
def daemon(store: Path, daemon_factory: Callable[..., Daemon]) -> Daemon:
    """The daemon serving ``store`` on an ephemeral loopback port."""
    return daemon_factory(store)


def raw_http(host: str, port: int, data: bytes, timeout: float = 10.0, read: bool = True) -> bytes:
    """Send raw bytes on a fresh TCP connection and return everything the server answers."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(data)
        if not read:
            return b""
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            chunks.append(chunk)
            if b"\r\n\r\n" in b"".join(chunks):
                head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
                m = re.search(rb"content-length: (\d+)", head, re.I)
                if m and len(body) >= int(m.group(1)):
                    break
        return b"".join(chunks)


@pytest.fixture
def raw() -> Callable[..., bytes]:
    """:func:`raw_http`: raw bytes over a fresh TCP connection."""
    return raw_http


@pytest.fixture
def bundle_maker() -> Callable[..., Path]:
    """:func:`make_bundle`: write a bundle directory by hand."""
    return make_bundle


@pytest.fixture
def installer() -> Callable[..., None]:
    """:func:`install`: copy a bundle directory into a store."""
    return install
