"""KServe v2 conformance over every stock client: tritonclient.http, tritonclient.grpc (sync and
aio) and gRPC streaming, against one daemon, with the same assertions.

One daemon serves the module (the real subprocess, HTTP and gRPC on free loopback ports, a bearer
token required). Counters are compared before and after, so the order of tests does not matter.
System shared memory is exercised with ``tritonclient.utils.shared_memory`` (real POSIX shm).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from kserve_clients import KINDS, InferenceServerException, KServeClient

TOKEN = "conformance-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}


def _ort(model: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return sess.run(None, {"input": x})[0]


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, digits_model: Path, digits_data: np.ndarray) -> Iterator:
    # By path: a plain ``from conftest import`` finds whichever test folder's conftest was imported first.
    import importlib.util

    spec = importlib.util.spec_from_file_location("daemon_conftest", Path(__file__).with_name("conftest.py"))
    assert spec is not None and spec.loader is not None
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    Daemon, install, make_bundle = harness.Daemon, harness.install, harness.make_bundle

    tmp = tmp_path_factory.mktemp("conformance")
    root = tmp / "store"
    root.mkdir()
    b = make_bundle(tmp / "src" / "digits-1.0.0", digits_model, "digits", "1.0.0", sample=digits_data[:4],
                    postprocess={"kind": "classification", "softmax": True, "top_k": 3})
    install(root, b)
    d = Daemon(root, tmp / "daemon.log", "--token", TOKEN, "--intra-op-threads", "1").wait_ready()
    assert d.grpc_url, d.log
    yield d
    assert d.stop() == 0


@pytest.fixture(params=KINDS)
def client(request: pytest.FixtureRequest, served) -> Iterator[KServeClient]:
    c = KServeClient(request.param, served.url, served.grpc_url, AUTH)
    yield c
    c.close()


def _x(digits_data: np.ndarray, n: int) -> np.ndarray:
    return np.ascontiguousarray(digits_data[:n])


class TestHealthAndMetadata:
    def test_health_server_and_model_metadata(self, client):
        assert client.live() and client.ready()
        assert client.model_ready("digits") and client.model_ready("digits", "1.0.0")
        assert not client.model_ready("digits", "9.9.9")
        meta = client.server_metadata()
        assert meta["name"] == "cuvil-edged"
        assert {"binary_tensor_data", "model_repository", "statistics", "system_shared_memory"} <= \
            set(meta["extensions"])
        m = client.model_metadata("digits")
        assert m["versions"] == ["1.0.0"] and m["platform"] == "onnxruntime_onnx"
        assert m["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 1, 8, 8]}]
        assert [o["name"] for o in m["outputs"]] == ["logits", "topk_scores", "topk_classes"]
        assert m["outputs"][2]["datatype"] == "INT64"
        cfg = client.model_config("digits")
        assert cfg["max_batch_size"] == 8
        assert cfg["input"] == [("input", "TYPE_FP32", [1, 8, 8])]
        assert cfg["output"][0] == ("logits", "TYPE_FP32", [10])
        assert cfg["dynamic_batching"]
        assert int(cfg["parameters"]["cuvil.batch_cap"]) >= 1

    def test_unknown_model_is_triton_error(self, client, digits_data):
        with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope'"):
            client.model_metadata("nope")
        inp = client.make_input("input", _x(digits_data, 1))
        with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope'"):
            client.infer("nope", [inp])
        with pytest.raises(InferenceServerException, match="version 7.7.7 is not found"):
            client.infer("digits", [inp], version="7.7.7")


class TestInfer:
    def test_outputs_match_onnxruntime(self, client, digits_model, digits_data):
        x = _x(digits_data, 3)
        outs = [client.make_output(n) for n in ("logits", "topk_scores", "topk_classes")]
        r = client.infer("digits", [client.make_input("input", x)], outputs=outs, request_id="req-7")
        want = _ort(digits_model, x)
        np.testing.assert_allclose(r.as_numpy("logits"), want, rtol=1e-5, atol=1e-5)
        order = np.argsort(-want, axis=1)[:, :3]
        np.testing.assert_array_equal(r.as_numpy("topk_classes"), order)
        np.testing.assert_allclose(r.as_numpy("topk_scores"), np.take_along_axis(_softmax(want), order, 1),
                                   rtol=1e-5, atol=1e-6)
        assert r.id == "req-7" and r.model_version == "1.0.0"

    def test_default_outputs_are_complete(self, client, digits_data):
        r = client.infer("digits", [client.make_input("input", _x(digits_data, 1))])
        assert set(r.outputs) == {"logits", "topk_scores", "topk_classes"}
        assert r.as_numpy("topk_classes").dtype == np.int64 and r.as_numpy("logits").shape == (1, 10)

    def test_classification_extension(self, client, digits_model, digits_data):
        x = _x(digits_data, 2)
        r = client.infer("digits", [client.make_input("input", x)],
                         outputs=[client.make_output("logits", class_count=2)])
        got = r.as_numpy("logits")
        want = _ort(digits_model, x)
        assert got.shape == (2, 2)
        for row, logits in zip(got, want, strict=True):
            assert [int(s.decode().split(":")[1]) for s in row] == list(np.argsort(-logits)[:2])

    def test_versioned_infer_counts_in_statistics(self, client, digits_data):
        before = client.statistics("digits")[0]
        inp = client.make_input("input", _x(digits_data, 2))
        for _ in range(3):
            client.infer("digits", [inp], version="1.0.0")
        after = client.statistics("digits")[0]
        assert after["name"] == "digits" and after["version"] == "1.0.0"
        assert after["success"] - before["success"] == 3
        assert after["inference_count"] - before["inference_count"] == 6
        assert 1 <= after["execution_count"] - before["execution_count"] <= 3
        assert 2 in after["batch_sizes"]
        assert [s["name"] for s in client.statistics()] == ["digits"]

    def test_bad_requests_are_refused_with_the_reason(self, client, digits_data):
        before = client.statistics("digits")[0]["fail"]
        bad_shape = client.make_input("input", np.zeros((1, 1, 8, 9), np.float32))
        with pytest.raises(InferenceServerException, match=r"unexpected shape for input 'input'.*\[1, 1, 8, 9\]"):
            client.infer("digits", [bad_shape])
        wrong_type = client.make_input("input", np.zeros((1, 1, 8, 8), np.float64), datatype="FP64")
        with pytest.raises(InferenceServerException, match="data-type is 'FP64', but model 'digits' expects 'FP32'"):
            client.infer("digits", [wrong_type])
        too_big = client.make_input("input", np.zeros((9, 1, 8, 8), np.float32))
        with pytest.raises(InferenceServerException, match="batch-size must be <= 8"):
            client.infer("digits", [too_big])
        with pytest.raises(InferenceServerException, match="unexpected inference output 'nope'"):
            client.infer("digits", [client.make_input("input", _x(digits_data, 1))],
                         outputs=[client.make_output("nope")])
        assert client.statistics("digits")[0]["fail"] - before == 4
        # And the daemon still serves.
        assert client.infer("digits", [client.make_input("input", _x(digits_data, 1))]).as_numpy("logits").shape == (1, 10)

    def test_bearer_token(self, client, digits_data):
        assert client.live()  # health stays open for probes: the adapter's headers are not needed
        with pytest.raises(InferenceServerException, match="bearer token"):
            client.model_metadata("digits", headers={})
        inp = client.make_input("input", _x(digits_data, 1))
        with pytest.raises(InferenceServerException, match="bearer token"):
            client.infer("digits", [inp], headers={"authorization": "Bearer wrong"})
        assert client.infer("digits", [inp]).as_numpy("logits").shape == (1, 10)


class TestRepository:
    def test_index_unload_load(self, client, digits_data):
        assert ("digits", "READY") in client.index()
        try:
            client.unload("digits")
            assert not client.model_ready("digits")
            with pytest.raises(InferenceServerException, match="Request for unknown model"):
                client.infer("digits", [client.make_input("input", _x(digits_data, 1))])
        finally:
            client.load("digits")
        assert client.model_ready("digits")
        assert client.infer("digits", [client.make_input("input", _x(digits_data, 1))]).as_numpy("logits").shape == (1, 10)


class TestSystemSharedMemory:
    def test_inputs_and_outputs_through_regions(self, client, digits_model, digits_data):
        import tritonclient.utils.shared_memory as shm

        x = _x(digits_data, 2)
        tag = uuid.uuid4().hex[:8]
        in_key, out_key = f"/cuvil-test-in-{tag}", f"/cuvil-test-out-{tag}"
        in_h = shm.create_shared_memory_region(f"in-{tag}", in_key, 64 + x.nbytes)
        out_h = shm.create_shared_memory_region(f"out-{tag}", out_key, 2 * 10 * 4 + 16)
        try:
            shm.set_shared_memory_region(in_h, [x], offset=64)
            client.shm_register(f"in-{tag}", in_key, x.nbytes, offset=64)
            client.shm_register(f"out-{tag}", out_key, 2 * 10 * 4 + 16)
            status = client.shm_status()
            assert status[f"in-{tag}"] == (in_key, 64, x.nbytes)
            assert status[f"out-{tag}"] == (out_key, 0, 96)
            inp = client.make_input("input", shape=list(x.shape), shm=(f"in-{tag}", 0, x.nbytes))
            out = client.make_output("logits", shm=(f"out-{tag}", 16, 80))
            r = client.infer("digits", [inp], outputs=[out, client.make_output("topk_classes")])
            assert r.outputs["logits"]["shared_memory_region"] in (f"out-{tag}", _grpc_param(f"out-{tag}"))
            want = _ort(digits_model, x)
            got = shm.get_contents_as_numpy(out_h, np.float32, [2, 10], offset=16)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
            np.testing.assert_array_equal(r.as_numpy("topk_classes"), np.argsort(-want, axis=1)[:, :3])
            # A frame written in place by the producer is what the next request sees: no copy kept.
            shm.set_shared_memory_region(in_h, [np.ascontiguousarray(x[::-1])], offset=64)
            client.infer("digits", [inp], outputs=[out])
            got = shm.get_contents_as_numpy(out_h, np.float32, [2, 10], offset=16)
            np.testing.assert_allclose(got, want[::-1], rtol=1e-5, atol=1e-5)
            # Bounds are checked against the region before memory is touched.
            past = client.make_input("input", shape=list(x.shape), shm=(f"in-{tag}", 8, x.nbytes))
            with pytest.raises(InferenceServerException, match="exceeds the .* bytes of region"):
                client.infer("digits", [past])
            small = client.make_output("logits", shm=(f"out-{tag}", 0, 40))
            with pytest.raises(InferenceServerException, match="shared_memory_byte_size is 40") as too_small:
                client.infer("digits", [inp], outputs=[small])
            # The client's error, not the server's (a stream's error_message carries no status).
            assert too_small.value.status() in ("400", "StatusCode.INVALID_ARGUMENT", None)
            assert client.kind == "grpc-stream" or too_small.value.status() is not None
            with pytest.raises(InferenceServerException, match="already registered"):
                client.shm_register(f"in-{tag}", in_key, 16)
            client.shm_unregister(f"in-{tag}")
            assert f"in-{tag}" not in client.shm_status()
            with pytest.raises(InferenceServerException, match=f"region 'in-{tag}' is not registered"):
                client.infer("digits", [inp])
        finally:
            client.shm_unregister()
            shm.destroy_shared_memory_region(in_h)
            shm.destroy_shared_memory_region(out_h)
        assert client.shm_status() == {}

    @pytest.mark.parametrize("key", ["/../etc/passwd", "/a/b", "..", "/", "/x\0y"])
    def test_keys_must_be_posix_shm_names(self, client, key):
        with pytest.raises(InferenceServerException, match="not a POSIX shared-memory name"):
            client.shm_register("evil", key, 16)
        assert "evil" not in client.shm_status()

    def test_region_past_the_object_and_missing_key(self, client):
        import tritonclient.utils.shared_memory as shm

        tag = uuid.uuid4().hex[:8]
        h = shm.create_shared_memory_region(f"r-{tag}", f"/cuvil-test-{tag}", 64)
        try:
            with pytest.raises(InferenceServerException, match="exceeds the 64 bytes"):
                client.shm_register(f"r-{tag}", f"/cuvil-test-{tag}", 64, offset=8)
        finally:
            shm.destroy_shared_memory_region(h)
        assert not os.path.exists(f"/dev/shm/cuvil-test-{tag}")
        with pytest.raises(InferenceServerException, match="cannot open shared-memory key"):
            client.shm_register(f"r-{tag}", f"/cuvil-test-{tag}", 64)

    def test_cuda_shared_memory_says_why_not(self, client):
        with pytest.raises(InferenceServerException, match="CUDA shared memory is not supported"):
            client.cuda_shm_register()


def _grpc_param(name: str):
    from tritonclient.grpc import service_pb2

    return service_pb2.InferParameter(string_param=name)


def test_one_stream_carries_many_requests(served, digits_model, digits_data):
    """ModelStreamInfer: twenty requests on one stream, answered by id, a bad one in the middle."""
    c = KServeClient("grpc-stream", served.url, served.grpc_url, AUTH)
    try:
        calls = []
        for i in range(20):
            x = np.ascontiguousarray(digits_data[i:i + 1 + i % 3])
            calls.append(("digits", [c.make_input("input", x)], [c.make_output("logits")], f"s{i}", ""))
        results = c.stream_many(calls)
        for i, r in enumerate(results):
            x = np.ascontiguousarray(digits_data[i:i + 1 + i % 3])
            assert r.id == f"s{i}"
            np.testing.assert_allclose(r.as_numpy("logits"), _ort(digits_model, x), rtol=1e-5, atol=1e-5)
        bad = [("digits", [c.make_input("input", np.zeros((1, 1, 8, 9), np.float32))], None, "bad", "")]
        with pytest.raises(InferenceServerException, match="unexpected shape"):
            c.stream_many(bad)
    finally:
        c.close()
