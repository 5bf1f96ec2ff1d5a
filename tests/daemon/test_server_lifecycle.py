"""Repository load/unload/reload under traffic, SIGHUP, SIGTERM drain, startup failures, memory limits."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


class Traffic:
    """Client threads sending binary infer requests until stopped; every outcome is kept."""

    def __init__(self, daemon, x: np.ndarray, model: str = "digits", threads: int = 2) -> None:
        self.daemon, self.x, self.model = daemon, x, model
        self.ok = 0
        self.errors: list[str] = []
        self.versions: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        client = self.daemon.client()
        inp = httpclient.InferInput("input", list(self.x.shape), "FP32")
        inp.set_data_from_numpy(self.x)
        while not self._stop.is_set():
            try:
                r = client.infer(self.model, [inp])
                assert r.as_numpy("logits").shape == (self.x.shape[0], 10)
                with self._lock:
                    self.ok += 1
                    version = r.get_response()["model_version"]
                    if not self.versions or self.versions[-1] != version:
                        self.versions.append(version)
            except Exception as exc:  # every failure is a test failure, kept for the message
                with self._lock:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
        client.close()

    def __enter__(self) -> Traffic:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)

    def wait_for(self, n: int, timeout: float = 30.0) -> None:
        start = self.ok
        deadline = time.monotonic() + timeout
        while self.ok < start + n and time.monotonic() < deadline:
            time.sleep(0.01)


def _repo(daemon, action: str, model: str, body: dict | None = None) -> tuple[int, str]:
    conn = http.client.HTTPConnection(*daemon.host_port, timeout=60)
    try:
        conn.request("POST", f"/v2/repository/models/{model}/{action}", body=json.dumps(body or {}))
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


class TestRepository:
    @pytest.mark.slow
    def test_swap_versions_under_traffic_without_failures(self, tmp_path, store, daemon, digits_model,
                                                          digits_data, image_model, bundle_maker, installer):
        from cuvil_edge.daemon.store import BundleStore

        bs = BundleStore(store)
        installer(store, bundle_maker(tmp_path / "b11", digits_model, "digits", "1.1.0", sample=digits_data[:4]),
                  make_current=False)
        broken = bundle_maker(tmp_path / "b12", digits_model, "digits", "1.2.0", sample=digits_data[:4],
                              expected_offset=1.0)
        installer(store, broken, make_current=False)
        installer(store, bundle_maker(tmp_path / "img", image_model, "imgcls", "1.0.0"), make_current=True)
        c = daemon.client()
        x = np.ascontiguousarray(digits_data[:2])
        with Traffic(daemon, x) as traffic:
            traffic.wait_for(50)
            # 1. A good new version, through the repository API.
            bs.set_current("digits", "1.1.0")
            c.load_model("digits")
            traffic.wait_for(50)
            assert c.get_model_metadata("digits")["versions"] == ["1.1.0"]
            # 2. A broken version (its sample output is wrong): the load fails, 1.1.0 keeps serving.
            bs.set_current("digits", "1.2.0")
            with pytest.raises(InferenceServerException, match="differs from expected.npz"):
                c.load_model("digits")
            traffic.wait_for(50)
            assert c.get_model_metadata("digits")["versions"] == ["1.1.0"]
            # 3. SIGHUP after pointing current back at 1.0.0.
            bs.set_current("digits", "1.0.0")
            daemon.send(signal.SIGHUP)
            deadline = time.monotonic() + 30
            while c.get_model_metadata("digits")["versions"] != ["1.0.0"] and time.monotonic() < deadline:
                time.sleep(0.05)
            assert c.get_model_metadata("digits")["versions"] == ["1.0.0"]
            traffic.wait_for(50)
            # 4. Another model loaded and unloaded repeatedly beside the traffic.
            for _ in range(3):
                c.load_model("imgcls")
                assert c.is_model_ready("imgcls")
                c.unload_model("imgcls")
                assert not c.is_model_ready("imgcls")
            traffic.wait_for(50)
        assert traffic.errors == []
        assert traffic.ok > 250
        assert traffic.versions[0] == "1.0.0" and "1.1.0" in traffic.versions and traffic.versions[-1] == "1.0.0"
        assert "1.2.0" not in traffic.versions
        index = {m["name"]: m for m in c.get_model_repository_index()}
        assert index["digits"]["state"] == "READY" and index["digits"]["version"] == "1.0.0"
        assert index["imgcls"]["state"] == "UNAVAILABLE" and index["imgcls"]["reason"] == "unloaded"
        with pytest.raises(InferenceServerException, match="Request for unknown model: 'imgcls' has no available"):
            c.get_model_metadata("imgcls")

    def test_load_errors(self, daemon):
        status, text = _repo(daemon, "load", "ghost")
        assert status == 400 and "failed to load 'ghost'" in text and "not in the store" in text
        status, text = _repo(daemon, "unload", "ghost")
        assert status == 400 and "not loaded" in text
        assert daemon.client().is_model_ready("digits")


class TestSignals:
    def test_sigterm_drains_in_flight_requests(self, store, daemon_factory, digits_model, digits_data):
        # A 1.5 s queue delay holds requests in flight while SIGTERM arrives.
        d = daemon_factory(store, "--max-queue-delay-us", "1500000", "--preferred-batch", "8")
        x = np.ascontiguousarray(digits_data[:1])
        results: list[object] = []

        def one() -> None:
            client = d.client()
            inp = httpclient.InferInput("input", [1, 1, 8, 8], "FP32")
            inp.set_data_from_numpy(x)
            try:
                results.append(client.infer("digits", [inp]).as_numpy("logits"))
            except Exception as exc:
                results.append(exc)
            finally:
                client.close()

        threads = [threading.Thread(target=one) for _ in range(4)]
        for t in threads:
            t.start()
        queued = 'cuvil_model_queue_size{model="digits",version="1.0.0"} 4'
        deadline = time.monotonic() + 10
        while queued not in d.metrics() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert queued in d.metrics()
        t0 = time.monotonic()
        d.send(signal.SIGTERM)
        for t in threads:
            t.join(30)
        assert d.proc.wait(30) == 0
        import onnxruntime as ort

        want = ort.InferenceSession(str(digits_model)).run(None, {"input": x})[0]
        assert len(results) == 4
        for r in results:
            assert isinstance(r, np.ndarray), r
            np.testing.assert_allclose(r, want, rtol=1e-5, atol=1e-5)
        assert time.monotonic() - t0 < 10
        assert "SIGTERM: draining" in d.log and "stopped after" in d.log


    def test_unload_lets_queued_requests_finish(self, store, daemon_factory, digits_data):
        # A 1 s queue delay holds three requests in the batcher while the model is unloaded.
        d = daemon_factory(store, "--max-queue-delay-us", "1000000", "--preferred-batch", "8")
        results: list[object] = []

        def one() -> None:
            client = d.client()
            inp = httpclient.InferInput("input", [1, 1, 8, 8], "FP32")
            inp.set_data_from_numpy(np.ascontiguousarray(digits_data[:1]))
            try:
                results.append(client.infer("digits", [inp]).get_response()["model_version"])
            except Exception as exc:
                results.append(exc)
            finally:
                client.close()

        threads = [threading.Thread(target=one) for _ in range(3)]
        for t in threads:
            t.start()
        queued = 'cuvil_model_queue_size{model="digits",version="1.0.0"} 3'
        deadline = time.monotonic() + 10
        while queued not in d.metrics() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _repo(d, "unload", "digits")[0] == 200
        assert not d.client().is_model_ready("digits")
        for t in threads:
            t.join(30)
        assert results == ["1.0.0"] * 3


def _wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.1)


class TestStartup:
    @pytest.mark.parametrize("args, message", [
        (["--board", "no-such-board"], "--board 'no-such-board'"),
        (["--telemetry", "bogus:thing"], "unknown telemetry source"),
        (["--max-body-mb", "-1"], "--max-body-mb"),
        (["--device", "tpu"], "--device 'tpu'"),
    ])
    def test_bad_options_exit_3(self, store, daemon_factory, args, message):
        d = daemon_factory(store, *args, ready=False)
        assert d.proc.wait(60) == 3
        assert message in d.log

    def test_missing_store_exit_3(self, tmp_path, daemon_factory):
        d = daemon_factory(tmp_path / "nowhere", ready=False)
        assert d.proc.wait(60) == 3
        assert "does not exist" in d.log

    def test_port_in_use_exit_3(self, store, daemon, daemon_factory):
        host, port = daemon.host_port
        d2 = daemon_factory(store, "--port", str(port), ready=False)
        assert d2.proc.wait(60) == 3
        assert f"cannot listen on 127.0.0.1:{port}" in d2.log

    def test_strict_broken_model_exit_3(self, tmp_path, store, digits_model, digits_data, bundle_maker, installer,
                                        daemon_factory):
        installer(store, bundle_maker(tmp_path / "bad", digits_model, "digits", "2.0.0", sample=digits_data[:4],
                                      expected_offset=1.0))
        d = daemon_factory(store, "--strict", "1", ready=False)
        assert d.proc.wait(60) == 3
        assert "differs from expected.npz" in d.log

    @staticmethod
    def _unrunnable(tmp_path, digits_model, digits_data, bundle_maker, name="broken"):
        """A bundle whose warm-up input the runtime refuses (ONNX Runtime raises its own error)."""
        b = bundle_maker(tmp_path / name, digits_model, name, "1.0.0", sample=digits_data[:2])
        np.savez(b / "sample" / "inputs.npz", input=np.zeros((2, 1, 5, 5), np.float32))
        return b

    def test_a_model_that_fails_warm_up_is_reported_and_the_others_serve(self, tmp_path, store, digits_model,
                                                                           digits_data, bundle_maker, installer,
                                                                           daemon_factory):
        installer(store, self._unrunnable(tmp_path, digits_model, digits_data, bundle_maker))
        d = daemon_factory(store)
        assert "Traceback" not in d.log
        c = d.client()
        assert c.is_model_ready("digits") and not c.is_model_ready("broken")
        index = {m["name"]: m for m in c.get_model_repository_index()}
        assert index["broken"]["state"] == "UNAVAILABLE"
        assert "warm-up failed" in index["broken"]["reason"] and "broken 1.0.0" in index["broken"]["reason"]
        with pytest.raises(Exception, match="warm-up failed"):
            c.get_model_metadata("broken")
        x = digits_data[:1]
        inp = httpclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        assert c.infer("digits", [inp]).as_numpy("topk_classes").shape == (1, 3)

    def test_no_model_can_serve_exit_3(self, tmp_path, digits_model, digits_data, bundle_maker, installer,
                                       daemon_factory):
        root = tmp_path / "only-broken"
        root.mkdir()
        installer(root, self._unrunnable(tmp_path, digits_model, digits_data, bundle_maker))
        d = daemon_factory(root, ready=False)
        assert d.proc.wait(60) == 3
        assert "no model can serve" in d.log and "Traceback" not in d.log

    def test_strict_unrunnable_model_exit_3(self, tmp_path, store, digits_model, digits_data, bundle_maker,
                                            installer, daemon_factory):
        installer(store, self._unrunnable(tmp_path, digits_model, digits_data, bundle_maker))
        d = daemon_factory(store, "--strict", "1", ready=False)
        assert d.proc.wait(60) == 3
        assert "'broken' failed to load" in d.log and "Traceback" not in d.log

    def test_env_options(self, store, daemon_factory, tmp_path):
        d = daemon_factory(store, env={"CUVIL_EDGED_MAX_BATCH": "4", "CUVIL_EDGED_MODELS": "digits"})
        assert d.client().get_model_config("digits")["max_batch_size"] == 4


class TestMemory:
    def test_library_pages_loading_read_are_handed_back_once_ready(self, store, daemon_factory):
        d = daemon_factory(store)
        m = re.search(r"handed back ([\d.]+) MB of library pages", d.log)
        assert m is not None, d.log  # reported, with what it freed (pages the test process maps too stay)
        assert d.log.index("handed back") < d.log.index("ready on")  # before the daemon says it is ready
        assert d.client().is_model_ready("digits")
        off = daemon_factory(store, "--page-out", "0")
        assert "library pages" not in off.log

    def test_scratch_a_burst_grew_is_given_back_once_the_model_idles(self, store, daemon_factory,
                                                                     digits_data):
        given_back = re.compile(r"digits 1\.0\.0: idle after batches of up to (\d+) rows: "
                                r"([\d.]+) MB of runtime scratch given back")

        def infer(d, rows: int) -> None:
            x = np.ascontiguousarray(digits_data[:rows])
            inp = httpclient.InferInput("input", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            assert d.client().infer("digits", [inp]).as_numpy("logits").shape == (rows, 10)

        d = daemon_factory(store, "--tick", "0.1", "--scratch-idle-s", "0.5", "--log-level", "debug")
        infer(d, 1)
        time.sleep(1.0)
        assert not given_back.search(d.log), d.log  # batch 1 grows nothing: nothing to give back
        infer(d, 8)
        t0 = time.monotonic()
        _wait_for(lambda: given_back.search(d.log) is not None, 10, "the burst's scratch to be given back")
        assert time.monotonic() - t0 >= 0.4  # not before the model idled --scratch-idle-s
        assert given_back.search(d.log).group(1) == "8"
        time.sleep(0.5)
        assert len(given_back.findall(d.log)) == 1  # once per burst, not every tick
        infer(d, 1)  # still serves
        off = daemon_factory(store, "--tick", "0.1", "--scratch-idle-s", "0", "--log-level", "debug")
        infer(off, 8)
        time.sleep(1.0)
        assert not given_back.search(off.log)

    def test_model_over_budget_is_refused_with_507(self, store, daemon_factory):
        # Orin Nano 8 GB with all but 40 MiB reserved: the digits bundle's estimate does not fit.
        d = daemon_factory(store, "--board", "orin-nano-8gb", "--memory-reserve-mb", str(8192 - 40))
        c = d.client()
        assert not c.is_model_ready("digits")
        index = {m["name"]: m for m in c.get_model_repository_index()}
        assert index["digits"]["state"] == "UNAVAILABLE" and "MiB" in index["digits"]["reason"]
        status, text = _repo(d, "load", "digits")
        assert status == 507
        assert "cannot load 'digits:1.0.0'" in text and "budget" in text
        assert "cuvil_memory_rejected_admissions_total 2" in d.metrics()

    @pytest.mark.slow
    def test_pressure_ladder_rejects_with_503_then_recovers(self, store, daemon_factory, live_tegrastats, digits_data):
        # A live Orin tegrastats log (tegrastats --logfile, a line every 0.1 s) that this test steers:
        # comfortable while the daemon starts, nearly full once the model is loaded and idle, then
        # comfortable again. Steering by the daemon's state, not by a clock, keeps the order fixed
        # however slow the machine is (a replay timed from the start raced the model's load).
        tail = ("CPU [6%@729,9%@729,5%@729,16%@729,off,off] EMC_FREQ 4%@2133 GR3D_FREQ 0%@611 "
                "CPU@47.9C GPU@45.8C VDD_IN 5299mW/5299mW")
        squeeze = f"RAM 7800/7852MB (lfb 2x4MB) SWAP 1500/3926MB (cached 0MB) {tail}"
        normal = f"RAM 2100/7852MB (lfb 900x4MB) SWAP 0/3926MB (cached 0MB) {tail}"
        writer = live_tegrastats(normal)
        try:
            d = daemon_factory(store, "--board", "orin-nano-8gb", "--tick", "0.1", "--telemetry",
                               f"logfile:{writer.path}")
            writer.line = squeeze
            _wait_for(lambda: 'cuvil_memory_pressure_steps_total{step="REJECT"} 1' in d.metrics(), 30,
                      "the ladder to reach REJECT")
            x = np.ascontiguousarray(digits_data[:1])
            body = json.dumps({"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32",
                                           "data": x.ravel().tolist()}]})
            seen: list[int] = []
            retry_after = None
            deadline = time.monotonic() + 45
            while time.monotonic() < deadline:
                conn = http.client.HTTPConnection(*d.host_port, timeout=10)
                conn.request("POST", "/v2/models/digits/infer", body=body)
                resp = conn.getresponse()
                text = resp.read().decode()
                conn.close()
                if not seen or seen[-1] != resp.status:
                    seen.append(resp.status)
                if resp.status == 503:
                    retry_after = resp.getheader("retry-after")
                    assert "memory pressure" in json.loads(text)["error"]
                    writer.line = normal  # one refusal seen: the squeeze may end
                if 503 in seen and resp.status != 503:
                    break
                time.sleep(0.05)
        finally:
            writer.stop()
        assert 503 in seen and retry_after is not None and int(retry_after) >= 1
        # The ladder unloaded the idle model on its way to REJECT: while it is away requests get 503
        # with Retry-After too (never 400 "unknown model"), and once calm it loads again and serves.
        assert seen[-1] == 200 and 400 not in seen, seen
        metrics = d.metrics()
        assert 'cuvil_memory_pressure_steps_total{step="REJECT"} 1' in metrics
        assert 'cuvil_memory_pressure_steps_total{step="UNLOAD_LRU"} 1' in metrics
        assert "unloading the least recently used idle model digits:1.0.0" in d.log
        assert _repo(d, "load", "digits")[0] == 200
        inp = httpclient.InferInput("input", [1, 1, 8, 8], "FP32")
        inp.set_data_from_numpy(x)
        assert d.client().infer("digits", [inp]).as_numpy("logits").shape == (1, 10)


def test_signed_bundle_verified_before_serving(tmp_path, digits_model, digits_data, daemon_factory):
    """A .cvb written by the lead's bundle writer installs, verifies with --pub, and serves."""
    from cuvil_edge.bundle import generate_keypair, write_bundle
    from cuvil_edge.daemon.store import BundleStore

    sec, pub = tmp_path / "k.sec", tmp_path / "k.pub"
    generate_keypair(sec, pub)
    x = digits_data[:4]
    import onnxruntime as ort

    want = ort.InferenceSession(str(digits_model)).run(None, {"input": x})[0]
    import io

    def npz(**arrays: np.ndarray) -> bytes:
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        return buf.getvalue()

    manifest = {"name": "digits", "version": "3.0.0", "target": {"name": "x86-host", "arch": "x86_64"},
                "precision": "fp32", "format_kind": "ort-cpu", "model": "model.onnx",
                "inputs": [{"name": "input", "dtype": "float32", "shape": [-1, 1, 8, 8]}],
                "outputs": [{"name": "logits", "dtype": "float32", "shape": [-1, 10]}], "max_batch": 8,
                "preprocess": {"kind": "none"}, "postprocess": {"kind": "none"},
                "validation": {"sample_inputs": "sample/inputs.npz", "sample_expected": "sample/expected.npz",
                               "rtol": 1e-3, "atol": 1e-3}}
    cvb = tmp_path / "digits.cvb"
    write_bundle(cvb, manifest, {"model.onnx": digits_model, "sample/inputs.npz": npz(input=x),
                                 "sample/expected.npz": npz(logits=want)}, sec)
    root = tmp_path / "store"
    root.mkdir()
    assert BundleStore(root).install(cvb, public_key=pub) == ("digits", "3.0.0")
    d = daemon_factory(root, "--pub", str(pub))
    assert d.client().get_model_metadata("digits")["versions"] == ["3.0.0"]
    # Tamper with the served model: a reload refuses it and 3.0.0 keeps serving from memory.
    model = root / "bundles" / "digits" / "3.0.0" / "model.onnx"
    os.chmod(model, 0o644)
    model.write_bytes(model.read_bytes() + b"\0")
    status, text = _repo(d, "load", "digits")
    assert status == 400 and "model.onnx" in text
    assert d.client().is_model_ready("digits")


def test_store_layout_helpers(tmp_path: Path, digits_model, bundle_maker):
    from cuvil_edge.daemon.store import BundleStore
    from cuvil_edge.errors import DaemonError

    bs = BundleStore(tmp_path / "s")
    (tmp_path / "s").mkdir()
    bs.check()
    assert bs.names() == []
    bs.install(bundle_maker(tmp_path / "a", digits_model, "digits", "1.0.0"), make_current=False,
               allow_unsigned=True)
    assert bs.current("digits") == "1.0.0"  # the only version, no link needed
    bs.install(bundle_maker(tmp_path / "b", digits_model, "digits", "1.1.0"), make_current=False,
               allow_unsigned=True)
    with pytest.raises(DaemonError, match="several versions and no 'current' link"):
        bs.path("digits")
    bs.set_current("digits", "1.1.0")
    assert os.readlink(bs.bundles / "digits" / "current") == "1.1.0"
    assert bs.path("digits").name == "1.1.0" and bs.versions("digits") == ["1.0.0", "1.1.0"]
    with pytest.raises(DaemonError, match="invalid model name"):
        bs.path("../etc")


def test_cli_help_and_option_precedence(tmp_path):
    import subprocess
    import sys

    from cuvil_edge.daemon.config import OPTIONS, load
    from cuvil_edge.errors import DaemonError

    out = subprocess.run([sys.executable, "-m", "cuvil_edge.daemon.main", "--help"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0
    for name in OPTIONS:
        assert "--" + name.replace("_", "-") in out.stdout
        assert "CUVIL_EDGED_" + name.upper() in out.stdout
    cfg = load(["--port", "9001"], {"CUVIL_EDGED_PORT": "9002", "CUVIL_EDGED_HOST": "127.0.0.2",
                                    "CUVIL_EDGED_PREFERRED_BATCH": "2,4", "CUVIL_EDGED_WARMUP": "false"})
    assert (cfg.port, cfg.host, cfg.preferred_batch, cfg.warmup) == (9001, "127.0.0.2", [2, 4], False)
    token = tmp_path / "token"
    token.write_text("abc\n")
    assert load(["--token-file", str(token)], {}).token == "abc"
    with pytest.raises(DaemonError, match="CUVIL_EDGED_PORT='x'"):
        load([], {"CUVIL_EDGED_PORT": "x"})
    with pytest.raises(DaemonError, match="--max-depth 0"):
        load(["--max-depth", "0"], {})
