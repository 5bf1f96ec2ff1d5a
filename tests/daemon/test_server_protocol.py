"""KServe v2 as tritonclient.http speaks it, against the real daemon subprocess."""

from __future__ import annotations

import http.client
import json
import socket
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from polling import wait_until
from tritonclient.utils import InferenceServerException

from cuvil_edge.daemon.models import BATCH_SLOWER_CUTOFF


def _ort(model: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return sess.run(None, {"input": x})[0]


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


class TestHealthAndMetadata:
    def test_health_server_and_model_metadata(self, daemon):
        c = daemon.client()
        assert c.is_server_live() and c.is_server_ready()
        assert c.is_model_ready("digits") and c.is_model_ready("digits", "1.0.0")
        assert not c.is_model_ready("digits", "9.9.9")
        meta = c.get_server_metadata()
        assert meta["name"] == "cuvil-edged"
        assert {"binary_tensor_data", "model_repository", "statistics"} <= set(meta["extensions"])
        m = c.get_model_metadata("digits")
        assert m["versions"] == ["1.0.0"]
        assert m["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 1, 8, 8]}]
        assert [o["name"] for o in m["outputs"]] == ["logits", "topk_scores", "topk_classes"]
        cfg = c.get_model_config("digits")
        assert cfg["max_batch_size"] == 8
        assert cfg["input"][0]["dims"] == [1, 8, 8] and cfg["input"][0]["data_type"] == "TYPE_FP32"
        assert "dynamic_batching" in cfg
        # Warm-up measured the time per sample by batch size; the cap is the largest size within
        # BATCH_SLOWER_CUTOFF of the best one's time per sample.
        profile = json.loads(cfg["parameters"]["cuvil.batch_profile_us_per_sample"]["string_value"])
        assert sorted(int(k) for k in profile) == [1, 2, 4, 8] and all(v > 0 for v in profile.values())
        best = min(profile.values())
        cap = int(cfg["parameters"]["cuvil.batch_cap"]["string_value"])
        assert profile[str(cap)] <= best * BATCH_SLOWER_CUTOFF
        assert all(profile[k] > best * BATCH_SLOWER_CUTOFF for k in profile if int(k) > cap)

    def test_unknown_model_metadata_is_triton_error(self, daemon):
        with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope'"):
            daemon.client().get_model_metadata("nope")


class TestInfer:
    @pytest.mark.parametrize("binary_in", [True, False])
    @pytest.mark.parametrize("binary_out", [True, False])
    def test_outputs_match_onnxruntime(self, daemon, digits_model, digits_data, binary_in, binary_out):
        c = daemon.client()
        x = np.ascontiguousarray(digits_data[:3])
        inp = httpclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=binary_in)
        outs = [httpclient.InferRequestedOutput(n, binary_data=binary_out)
                for n in ("logits", "topk_scores", "topk_classes")]
        r = c.infer("digits", [inp], outputs=outs, request_id="req-7")
        want = _ort(digits_model, x)
        np.testing.assert_allclose(r.as_numpy("logits"), want, rtol=1e-5, atol=1e-5)
        order = np.argsort(-want, axis=1)[:, :3]
        np.testing.assert_array_equal(r.as_numpy("topk_classes"), order)
        np.testing.assert_allclose(r.as_numpy("topk_scores"),
                                   np.take_along_axis(_softmax(want), order, 1), rtol=1e-5, atol=1e-6)
        assert r.get_response()["id"] == "req-7"
        assert r.get_response()["model_version"] == "1.0.0"

    def test_default_outputs_are_binary_and_complete(self, daemon, digits_data):
        """tritonclient asks for binary outputs when none is named (binary_data_output)."""
        x = np.ascontiguousarray(digits_data[:1])
        inp = httpclient.InferInput("input", [1, 1, 8, 8], "FP32")
        inp.set_data_from_numpy(x)
        r = daemon.client().infer("digits", [inp])
        outs = r.get_response()["outputs"]
        assert {o["name"] for o in outs} == {"logits", "topk_scores", "topk_classes"}
        assert all("binary_data_size" in o["parameters"] for o in outs)
        assert r.as_numpy("topk_classes").dtype == np.int64

    def test_classification_extension(self, daemon, digits_model, digits_data):
        x = np.ascontiguousarray(digits_data[:2])
        inp = httpclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        r = daemon.client().infer("digits", [inp],
                                  outputs=[httpclient.InferRequestedOutput("logits", class_count=2)])
        got = r.as_numpy("logits")
        want = _ort(digits_model, x)
        assert got.shape == (2, 2)
        for row, logits in zip(got, want, strict=True):
            idx = [int(s.decode().split(":")[1]) for s in row]
            assert idx == list(np.argsort(-logits)[:2])

    def test_versioned_infer_and_stats(self, daemon, digits_data):
        c = daemon.client()
        x = np.ascontiguousarray(digits_data[:2])
        inp = httpclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        for _ in range(3):
            c.infer("digits", [inp], model_version="1.0.0")
        stats = c.get_inference_statistics("digits")["model_stats"][0]
        assert stats["name"] == "digits" and stats["version"] == "1.0.0"
        assert stats["inference_stats"]["success"]["count"] == 3
        assert stats["inference_count"] == 6 and stats["execution_count"] == 3  # warm-up not counted
        assert stats["batch_stats"][0]["batch_size"] == 2
        all_stats = c.get_inference_statistics()["model_stats"]
        assert [s["name"] for s in all_stats] == ["digits"]


class TestPipeline:
    def test_image_input_is_resized_and_normalized(self, tmp_path, image_model, bundle_maker, installer,
                                                   daemon_factory):
        pre = {"kind": "image", "size": [16, 16], "resize": "bilinear", "letterbox": False, "layout": "NCHW",
               "color": "RGB", "mean": [127.0, 127.0, 127.0], "std": [128.0, 128.0, 128.0], "dtype": "float32"}
        b = bundle_maker(tmp_path / "b", image_model, "imgcls", "2.0.0", preprocess=pre,
                         postprocess={"kind": "classification", "softmax": True, "top_k": 2})
        root = tmp_path / "store2"
        root.mkdir()
        installer(root, b)
        d = daemon_factory(root)
        c = d.client()
        meta = c.get_model_metadata("imgcls")
        assert {"name": "image", "datatype": "UINT8", "shape": [-1, -1, -1, 3]} in meta["inputs"]
        img = (np.random.default_rng(3).random((16, 16, 3)) * 255).astype(np.uint8)
        inp = httpclient.InferInput("image", [1, 16, 16, 3], "UINT8")
        inp.set_data_from_numpy(img[None])
        r = c.infer("imgcls", [inp])
        x = ((img.astype(np.float32) - 127.0) / 128.0).transpose(2, 0, 1)[None]
        want = _ort(image_model, np.ascontiguousarray(x))
        np.testing.assert_allclose(r.as_numpy("logits"), want, rtol=1e-4, atol=1e-4)
        assert list(r.as_numpy("topk_classes")[0]) == list(np.argsort(-want[0])[:2])
        # A larger frame is resized (bilinear) to 16x16 first; 32x32 -> 16x16 averages 2x2 blocks.
        big = np.repeat(np.repeat(img, 2, axis=0), 2, axis=1)
        inp = httpclient.InferInput("image", [32, 32, 3], "UINT8")
        inp.set_data_from_numpy(big)
        r2 = c.infer("imgcls", [inp])
        np.testing.assert_allclose(r2.as_numpy("logits"), want, rtol=1e-4, atol=1e-4)


class TestTransports:
    def test_unix_socket(self, store, tmp_path, daemon_factory):
        sock_path = tmp_path / "edged.sock"
        d = daemon_factory(store, "--uds", str(sock_path))
        assert d.url.startswith("unix:")

        class UnixConnection(http.client.HTTPConnection):
            def connect(self) -> None:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.connect(str(sock_path))

        conn = UnixConnection("localhost")
        conn.request("GET", "/v2/health/ready")
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200
        body = json.dumps({"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32",
                                       "data": [0.5] * 64}]})
        conn.request("POST", "/v2/models/digits/infer", body=body)
        resp = conn.getresponse()
        doc = json.loads(resp.read())
        assert resp.status == 200 and doc["outputs"][0]["shape"] == [1, 10]
        conn.close()
        assert d.stop() == 0
        assert not sock_path.exists()

    def test_bearer_token(self, store, daemon_factory, digits_data):
        d = daemon_factory(store, env={"CUVIL_EDGED_TOKEN": "s3cret"})
        assert d.client().is_server_live()  # health stays open for probes
        with pytest.raises(InferenceServerException, match="bearer token"):
            d.client().get_model_metadata("digits")
        inp = httpclient.InferInput("input", [1, 1, 8, 8], "FP32")
        inp.set_data_from_numpy(np.ascontiguousarray(digits_data[:1]))
        with pytest.raises(InferenceServerException, match="401|bearer"):
            d.client().infer("digits", [inp], headers={"Authorization": "Bearer wrong"})
        r = d.client().infer("digits", [inp], headers={"Authorization": "Bearer s3cret"})
        assert r.as_numpy("logits").shape == (1, 10)


class TestMetrics:
    def test_prometheus_names_and_counts(self, store, daemon_factory, digits_data):
        d = daemon_factory(store, "--telemetry", "sim:orin-nano-8gb", "--board", "orin-nano-8gb", "--tick", "0.2")
        c = d.client()
        inp = httpclient.InferInput("input", [2, 1, 8, 8], "FP32")
        inp.set_data_from_numpy(np.ascontiguousarray(digits_data[:2]))
        for _ in range(5):
            c.infer("digits", [inp])
        with pytest.raises(InferenceServerException):
            bad = httpclient.InferInput("input", [1, 1, 8, 9], "FP32")
            bad.set_data_from_numpy(np.zeros((1, 1, 8, 9), np.float32))
            c.infer("digits", [bad])
        labels = '{model="digits",version="1.0.0"}'

        def scrape() -> dict[str, float]:
            conn = http.client.HTTPConnection(*d.host_port)
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            text = resp.read().decode()
            conn.close()
            assert resp.status == 200 and resp.getheader("content-type").startswith("text/plain")
            values = {}
            for line in text.splitlines():
                if line and not line.startswith("#"):
                    key, _, val = line.rpartition(" ")
                    values[key] = float(val)
            return values

        def ticked() -> dict[str, float] | None:
            values = scrape()
            sampled = any(k.startswith("cuvil_board_power_milliwatts{") for k in values)
            return values if sampled and f"cuvil_prefetch_depth{labels}" in values else None

        # A few ticks: telemetry samples and prefetch decisions.
        values = wait_until(ticked, "a telemetry sample and a prefetch decision in /metrics")
        assert values[f"nv_inference_request_success{labels}"] == 5
        assert values[f"nv_inference_request_failure{labels}"] == 1
        assert values[f"nv_inference_count{labels}"] == 10
        assert 1 <= values[f"nv_inference_exec_count{labels}"] <= 5
        for name in ("nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                     "nv_inference_compute_infer_duration_us"):
            assert f"{name}{labels}" in values
        assert values[f"nv_inference_compute_infer_duration_us{labels}"] > 0
        assert values["cuvil_memory_budget_bytes"] > 0
        assert values["cuvil_memory_used_bytes"] > 0
        assert 0 <= values["cuvil_board_gpu_utilization_percent"] <= 100
        assert "cuvil_board_emc_utilization_percent" in values
        assert values["cuvil_board_ram_total_bytes"] > 7e9  # the simulated Orin Nano 8 GB
        assert any(k.startswith("cuvil_board_power_milliwatts{") for k in values)
        assert 1 <= values[f"cuvil_prefetch_depth{labels}"] <= 2
        assert any(k.startswith("cuvil_memory_pressure_level{") for k in values)
        assert any(k.startswith("cuvil_memory_pressure_steps_total{") for k in values)
