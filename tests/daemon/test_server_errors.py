"""Bad requests get the right 4xx and a clear message, and never hurt the server."""

from __future__ import annotations

import http.client
import json
import socket
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from polling import wait_until
from tritonclient.utils import InferenceServerException


def _post(daemon, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict, str]:
    conn = http.client.HTTPConnection(*daemon.host_port, timeout=10)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, dict(resp.getheaders()), data.decode(errors="replace")
    finally:
        conn.close()


def _get(daemon, path: str) -> tuple[int, dict, str]:
    conn = http.client.HTTPConnection(*daemon.host_port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read().decode(errors="replace")
    finally:
        conn.close()


def _error(text: str) -> str:
    return json.loads(text)["error"]


def _infer_ok(daemon, digits_data) -> None:
    inp = httpclient.InferInput("input", [1, 1, 8, 8], "FP32")
    inp.set_data_from_numpy(np.ascontiguousarray(digits_data[:1]))
    client = daemon.client()
    try:
        assert client.infer("digits", [inp]).as_numpy("logits").shape == (1, 10)
    finally:
        client.close()  # its connection does not count in _connections() afterwards


def _connections(daemon) -> int:
    """The daemon's open client connections (``cuvil_server_connections``), this scrape's included."""
    _, _, text = _get(daemon, "/metrics")
    for line in text.splitlines():
        if line.startswith("cuvil_server_connections "):
            return int(float(line.rpartition(" ")[2]))
    raise AssertionError("cuvil_server_connections missing from /metrics")


def _dropped(daemon, baseline: int) -> bool:
    """Whether the daemon has closed every connection opened since ``baseline`` was read."""
    return _connections(daemon) <= baseline


def _json_body(data=None, shape=(1, 1, 8, 8), datatype="FP32", name="input", **extra) -> bytes:
    inp = {"name": name, "shape": list(shape), "datatype": datatype,
           "data": [0.5] * int(np.prod(shape)) if data is None else data}
    return json.dumps({"inputs": [inp], **extra}).encode()


def _binary_body(payload: bytes, declared: int, extra_header_len: int = 0) -> tuple[bytes, dict[str, str]]:
    header = json.dumps({"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32",
                                     "parameters": {"binary_data_size": declared}}]}).encode()
    return header + payload, {"Inference-Header-Content-Length": str(len(header) + extra_header_len)}


class TestBadInferRequests:
    def test_unknown_model(self, daemon, digits_data):
        inp = httpclient.InferInput("input", [1, 1, 8, 8], "FP32")
        inp.set_data_from_numpy(np.ascontiguousarray(digits_data[:1]))
        with pytest.raises(InferenceServerException) as exc:
            daemon.client().infer("nope", [inp])
        assert exc.value.status() == "400"
        assert "Request for unknown model: 'nope'" in exc.value.message()
        with pytest.raises(InferenceServerException, match="version 7.7.7 is not found"):
            daemon.client().infer("digits", [inp], model_version="7.7.7")

    @pytest.mark.parametrize("binary", [True, False])
    def test_wrong_datatype(self, daemon, binary, digits_data):
        inp = httpclient.InferInput("input", [1, 1, 8, 8], "FP64")
        inp.set_data_from_numpy(np.zeros((1, 1, 8, 8), np.float64), binary_data=binary)
        with pytest.raises(InferenceServerException, match="data-type is 'FP64', but model 'digits' expects 'FP32'"):
            daemon.client().infer("digits", [inp])
        _infer_ok(daemon, digits_data)

    def test_wrong_shape(self, daemon):
        inp = httpclient.InferInput("input", [1, 1, 8, 9], "FP32")
        inp.set_data_from_numpy(np.zeros((1, 1, 8, 9), np.float32))
        with pytest.raises(InferenceServerException, match=r"unexpected shape for input 'input'.*\[1, 1, 8, 9\]"):
            daemon.client().infer("digits", [inp])

    def test_batch_over_max_batch(self, daemon):
        inp = httpclient.InferInput("input", [9, 1, 8, 8], "FP32")
        inp.set_data_from_numpy(np.zeros((9, 1, 8, 8), np.float32))
        with pytest.raises(InferenceServerException, match="batch-size must be <= 8"):
            daemon.client().infer("digits", [inp])

    def test_wrong_element_count_json(self, daemon):
        status, _, text = _post(daemon, "/v2/models/digits/infer", _json_body(data=[0.5] * 63))
        assert status == 400 and "63 elements given for shape [1, 1, 8, 8] (64 expected)" in _error(text)

    def test_non_numeric_json_data(self, daemon):
        status, _, text = _post(daemon, "/v2/models/digits/infer", _json_body(data=["a"] * 64))
        assert status == 400 and "not a list of FP32" in _error(text)

    def test_wrong_binary_size(self, daemon):
        body, headers = _binary_body(b"\0" * 200, 200)
        status, _, text = _post(daemon, "/v2/models/digits/infer", body, headers)
        assert status == 400 and "binary_data_size 200 does not match" in _error(text)

    def test_truncated_binary_body(self, daemon):
        body, headers = _binary_body(b"\0" * 100, 256)  # declares 256 bytes, sends 100
        status, _, text = _post(daemon, "/v2/models/digits/infer", body, headers)
        assert status == 400 and "truncated binary data" in _error(text) and "only 100 remain" in _error(text)
        body, headers = _binary_body(b"\0" * 256, 256, extra_header_len=10_000)
        status, _, text = _post(daemon, "/v2/models/digits/infer", body, headers)
        assert status == 400 and "Inference-Header-Content-Length" in _error(text)

    def test_extra_binary_bytes(self, daemon):
        body, headers = _binary_body(b"\0" * 300, 256)
        status, _, text = _post(daemon, "/v2/models/digits/infer", body, headers)
        assert status == 400 and "44 bytes that no input claims" in _error(text)

    @pytest.mark.parametrize("body, message", [
        (b"{not json", "malformed JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b"{}", "non-empty 'inputs' list"),
        (json.dumps({"inputs": [{"name": "input"}]}).encode(), "'shape' must be a list"),
        (json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}).encode(),
         "unexpected inference input 'x'"),
        (_json_body(outputs=[{"name": "nope"}]), "unexpected inference output 'nope'"),
        (json.dumps({"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32"}]}).encode(),
         "neither 'data' nor parameters.binary_data_size"),
    ])
    def test_malformed_request(self, daemon, body, message):
        status, _, text = _post(daemon, "/v2/models/digits/infer", body)
        assert status == 400 and message in _error(text)

    def test_endpoint_and_method_errors(self, daemon):
        conn = http.client.HTTPConnection(*daemon.host_port, timeout=10)
        conn.request("GET", "/v2/models/digits/infer")
        resp = conn.getresponse()
        assert resp.status == 405 and "POST" in _error(resp.read().decode())
        conn.request("GET", "/v3/whatever")
        resp = conn.getresponse()
        assert resp.status == 404 and "no such endpoint" in _error(resp.read().decode())
        conn.close()


class TestTransportErrors:
    def test_body_over_limit_is_413(self, store, daemon_factory, raw, digits_data):
        d = daemon_factory(store, "--max-body-mb", "0.002")  # 2097 bytes
        host, port = d.host_port
        # Declared too large: refused from the headers, before any body byte is read.
        head = (f"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {2 << 20}\r\n\r\n").encode()
        answer = raw(host, port, head)
        assert answer.startswith(b"HTTP/1.1 413") and b"exceeds the limit of 2097 bytes" in answer
        assert b"--max-body-mb" in answer
        # Chunked, no length: refused once the received bytes pass the limit.
        chunk = b"x" * (256 << 10)
        body = b"".join(b"%x\r\n" % len(chunk) + chunk + b"\r\n" for _ in range(3)) + b"0\r\n\r\n"
        answer = raw(host, port, b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n" + body)
        assert answer.startswith(b"HTTP/1.1 413")
        # tritonclient sees it too.
        big = np.zeros((8, 1, 8, 8), np.float32)
        inp = httpclient.InferInput("input", list(big.shape), "FP32")
        inp.set_data_from_numpy(big)  # 2048 bytes of tensor plus the JSON header
        with pytest.raises(InferenceServerException, match="exceeds the limit"):
            d.client().infer("digits", [inp])
        _infer_ok(d, digits_data)

    def test_malformed_http(self, daemon, raw, digits_data):
        answer = raw(*daemon.host_port, b"THIS IS NOT HTTP\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 400") and b"malformed HTTP" in answer
        _infer_ok(daemon, digits_data)

    def test_client_disconnects(self, daemon, raw, digits_data):
        host, port = daemon.host_port
        header = json.dumps({"inputs": [{"name": "input", "shape": [8, 1, 8, 8], "datatype": "FP32",
                                         "parameters": {"binary_data_size": 2048}}]}).encode()
        full = header + np.ones((8, 1, 8, 8), np.float32).tobytes()
        head = (f"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(full)}\r\n"
                f"Inference-Header-Content-Length: {len(header)}\r\n\r\n").encode()
        baseline = _connections(daemon)
        # Mid-body: headers and half the body, then gone.
        raw(host, port, head + full[: len(full) // 2], read=False)
        # Mid-request after the body: the answer has nowhere to go.
        for _ in range(20):
            raw(host, port, head + full, read=False)
        # Mid-headers.
        raw(host, port, head[:20], read=False)
        wait_until(lambda: _dropped(daemon, baseline), "the daemon to drop the abandoned connections")
        _infer_ok(daemon, digits_data)
        stats = daemon.client().get_inference_statistics("digits")["model_stats"][0]
        served = stats["inference_stats"]["success"]["count"]
        assert served >= 1

    def test_no_leak_and_alive_after_abuse(self, daemon, raw, digits_data):
        """Hundreds of bad and abandoned requests, some 1 MB, leave the RSS flat."""
        host, port = daemon.host_port
        header = json.dumps({"inputs": [{"name": "input", "shape": [8, 1, 8, 8], "datatype": "FP32",
                                         "parameters": {"binary_data_size": 2048}}]}).encode()
        big = b"\0" * (1 << 20)
        head_big = (f"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {2 << 20}\r\n"
                    f"Inference-Header-Content-Length: {len(header)}\r\n\r\n").encode()

        def abuse(rounds: int) -> None:
            for i in range(rounds):
                raw(host, port, head_big + header + big, read=False)  # abandoned mid-body, 1 MB in
                status, _, _ = _post(daemon, "/v2/models/digits/infer", b"{broken" * 100)
                assert status == 400
                body, headers = _binary_body(b"\0" * 100, 256)
                assert _post(daemon, "/v2/models/digits/infer", body, headers)[0] == 400
                if i % 10 == 0:
                    _infer_ok(daemon, digits_data)

        baseline = _connections(daemon)
        abuse(40)
        wait_until(lambda: _dropped(daemon, baseline), "the daemon to drop the abandoned connections")
        base = daemon.rss_kb()
        abuse(200)
        wait_until(lambda: _dropped(daemon, baseline), "the daemon to drop the abandoned connections")
        grown_mb = (daemon.rss_kb() - base) / 1024
        assert grown_mb < 20, f"RSS grew {grown_mb:.1f} MB over 200 rounds (200 MB of abandoned bodies)"
        _infer_ok(daemon, digits_data)
        # Every abandoned connection was dropped.
        with socket.create_connection((host, port)):
            pass
        assert daemon.proc.poll() is None


class TestHttpDetails:
    def test_pipelined_requests_answer_in_order(self, daemon, raw):
        host, port = daemon.host_port
        req = b"GET /v2/models/digits/ready HTTP/1.1\r\nHost: x\r\n\r\n"
        meta = b"GET /v2/models/digits HTTP/1.1\r\nHost: x\r\n\r\n"
        last = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        with socket.create_connection((host, port), timeout=10) as s:
            s.sendall(req + meta + req + last)
            data = b""
            while True:  # ends only because the server closes after "Connection: close"
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        assert data.count(b"HTTP/1.1 200 OK") == 4
        assert data.index(b'"versions"') > data.index(b"HTTP/1.1 200 OK\r\n")

    def test_expect_100_continue(self, daemon):
        host, port = daemon.host_port
        body = _json_body()
        with socket.create_connection((host, port), timeout=10) as s:
            s.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
            assert s.recv(1024).startswith(b"HTTP/1.1 100 Continue")
            s.sendall(body)
            answer = s.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200 OK")

    def test_gzip_request_body(self, daemon, digits_data):
        inp = httpclient.InferInput("input", [2, 1, 8, 8], "FP32")
        inp.set_data_from_numpy(np.ascontiguousarray(digits_data[:2]))
        r = daemon.client().infer("digits", [inp], request_compression_algorithm="gzip")
        assert r.as_numpy("logits").shape == (2, 10)
        status, _, text = _post(daemon, "/v2/models/digits/infer", b"not gzip at all",
                                {"Content-Encoding": "gzip"})
        assert status == 400 and "not valid gzip data" in _error(text)

    def test_slow_client_gets_408_and_idle_connections_close(self, store, daemon_factory, digits_data):
        d = daemon_factory(store, "--request-timeout", "0.5", "--keep-alive", "0.8", "--tick", "0.1")
        host, port = d.host_port
        with socket.create_connection((host, port), timeout=10) as s:
            s.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            answer = s.recv(65536)
            assert answer.startswith(b"HTTP/1.1 408") and b"not received within 0.5 s" in answer
        with socket.create_connection((host, port), timeout=10) as s:
            s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(65536).startswith(b"HTTP/1.1 200")
            t0 = time.monotonic()
            assert s.recv(65536) == b""  # closed by the idle sweep
            assert 0.5 < time.monotonic() - t0 < 5
        _infer_ok(d, digits_data)


def test_abandoned_queued_requests_are_skipped(store, daemon_factory, raw, digits_data):
    """Requests whose clients left while they waited for a batch never run, and are accounted."""
    d = daemon_factory(store, "--max-queue-delay-us", "1500000", "--preferred-batch", "8")
    host, port = d.host_port
    body = _json_body()
    head = (f"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    for _ in range(3):
        raw(host, port, head + body, read=False)
    labels = '{model="digits",version="1.0.0"}'

    def metric(name: str) -> float:
        conn = http.client.HTTPConnection(host, port, timeout=10)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rpartition(" ")[2])
        raise AssertionError(f"{name} missing")

    deadline = time.monotonic() + 10
    while metric(f"cuvil_inference_cancelled_total{labels}") < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert metric(f"cuvil_inference_cancelled_total{labels}") == 3
    assert metric("cuvil_http_client_gone_total") == 3
    assert metric(f"nv_inference_exec_count{labels}") == 0
    # Nothing is left holding the model: it unloads (retires) and loads again.
    assert _post(d, "/v2/repository/models/digits/unload", b"")[0] == 200
    assert _post(d, "/v2/repository/models/digits/load", b"")[0] == 200
    _infer_ok(d, digits_data)
