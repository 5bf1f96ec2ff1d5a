"""gRPC honours the HTTP front end's limits and token: the same probes, over gRPC.

Stock tritonclient.grpc and a bare ``grpc`` channel with the daemon's own generated stub (which
also proves the checked-in ``grpc_service_pb2_grpc`` works) against the real daemon subprocess.
"""

from __future__ import annotations

import socket
import threading
import time

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from cuvil_edge.daemon.config import load
from cuvil_edge.daemon.grpc_server import grpc_address
from cuvil_edge.daemon.proto import grpc_service_pb2 as pb
from cuvil_edge.daemon.proto.grpc_service_pb2_grpc import GRPCInferenceServiceStub


def _request(x: np.ndarray) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="digits")
    req.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    req.raw_input_contents.append(np.ascontiguousarray(x).tobytes())
    return req


class TestAuthAndSize:
    def test_token_is_checked_before_the_message_is_read(self, store, daemon_factory, digits_data):
        d = daemon_factory(store, "--token", "s3cret", "--max-body-mb", "1")
        big = np.zeros((8, 1, 8, 8), np.float32)
        big_req = _request(big)
        big_req.raw_input_contents.append(b"\0" * (4 << 20))  # 4 MiB: over the 1 MiB limit
        with grpc.insecure_channel(d.grpc_url) as ch:
            stub = GRPCInferenceServiceStub(ch)
            # Without the token the answer is UNAUTHENTICATED, not the size error: the call is
            # refused from its metadata, before its 4 MiB message is read.
            with pytest.raises(grpc.RpcError) as no_token:
                stub.ModelInfer(big_req, timeout=30)
            assert no_token.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "bearer token" in no_token.value.details()
            # With it, the same message meets the size limit (from --max-body-mb).
            with pytest.raises(grpc.RpcError) as too_big:
                stub.ModelInfer(big_req, timeout=30, metadata=(("authorization", "Bearer s3cret"),))
            assert too_big.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            # The scheme is case-insensitive; a wrong token is not.
            ok = stub.ModelInfer(_request(digits_data[:1]), timeout=30,
                                 metadata=(("authorization", "bearer s3cret"),))
            assert ok.outputs[0].name == "logits" and len(ok.raw_output_contents[0]) == 40
            with pytest.raises(grpc.RpcError) as wrong:
                stub.ModelInfer(_request(digits_data[:1]), timeout=30,
                                metadata=(("authorization", "Bearer s3cre"),))
            assert wrong.value.code() == grpc.StatusCode.UNAUTHENTICATED
            # Health stays open for probes, as /v2/health/* over HTTP.
            assert stub.ServerLive(pb.ServerLiveRequest(), timeout=30).live
            assert stub.ServerReady(pb.ServerReadyRequest(), timeout=30).ready

    def test_malformed_message_is_refused_and_the_daemon_serves_on(self, daemon, digits_data):
        with grpc.insecure_channel(daemon.grpc_url) as ch:
            raw = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            with pytest.raises(grpc.RpcError) as exc:
                raw(b"\xff\xff\xff\xff garbage", timeout=30)
            assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "malformed ModelInferRequest message" in exc.value.details()
            with pytest.raises(grpc.RpcError) as missing:
                ch.unary_unary("/inference.GRPCInferenceService/TraceSetting")(b"", timeout=30)
            assert missing.value.code() == grpc.StatusCode.UNIMPLEMENTED
            stub = GRPCInferenceServiceStub(ch)
            req = _request(digits_data[:1])
            req.raw_input_contents[0] = req.raw_input_contents[0][:-4]  # one float short
            with pytest.raises(grpc.RpcError) as short:
                stub.ModelInfer(req, timeout=30)
            assert short.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "raw_input_contents has 252 bytes" in short.value.details()
            assert stub.ModelInfer(_request(digits_data[:2]), timeout=30).outputs[0].shape == [2, 10]


@pytest.mark.slow
def test_memory_pressure_is_resource_exhausted_with_a_retry_hint(store, daemon_factory, live_tegrastats, digits_data):
    """The steered squeeze of test_server_lifecycle's 503 test, over gRPC."""
    tail = ("CPU [6%@729,9%@729,5%@729,16%@729,off,off] EMC_FREQ 4%@2133 GR3D_FREQ 0%@611 "
            "CPU@47.9C GPU@45.8C VDD_IN 5299mW/5299mW")
    squeeze = f"RAM 7800/7852MB (lfb 2x4MB) SWAP 1500/3926MB (cached 0MB) {tail}"
    normal = f"RAM 2100/7852MB (lfb 900x4MB) SWAP 0/3926MB (cached 0MB) {tail}"
    writer = live_tegrastats(normal)
    d = daemon_factory(store, "--board", "orin-nano-8gb", "--tick", "0.1", "--telemetry", f"logfile:{writer.path}")
    writer.line = squeeze  # the model is loaded and idle: the ladder unloads it on its way to REJECT
    deadline = time.monotonic() + 30
    while 'cuvil_memory_pressure_steps_total{step="REJECT"} 1' not in d.metrics():
        assert time.monotonic() < deadline, "the ladder never reached REJECT"
        time.sleep(0.1)
    seen: list[str] = []
    retry: dict[str, str] = {}
    away: dict[str, str] = {}
    deadline = time.monotonic() + 45
    with grpc.insecure_channel(d.grpc_url) as ch:
        stub = GRPCInferenceServiceStub(ch)
        while time.monotonic() < deadline:
            try:
                stub.ModelInfer(_request(digits_data[:1]), timeout=30)
                code = "OK"
            except grpc.RpcError as exc:
                code = exc.code().name
                if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    assert "memory pressure" in exc.details() and "retry in" in exc.details()
                    retry = dict(exc.trailing_metadata() or ())
                    writer.line = normal  # one refusal seen: the squeeze may end
                if exc.code() == grpc.StatusCode.UNAVAILABLE:
                    assert "unloaded under memory pressure" in exc.details()
                    away = dict(exc.trailing_metadata() or ())
            if not seen or seen[-1] != code:
                seen.append(code)
            if "RESOURCE_EXHAUSTED" in seen and code != "RESOURCE_EXHAUSTED":
                break
            time.sleep(0.05)
    assert "RESOURCE_EXHAUSTED" in seen, seen
    assert int(retry["retry-after"]) >= 1
    assert int(retry["grpc-retry-pushback-ms"]) == 1000 * int(retry["retry-after"])
    # As over HTTP: the ladder unloaded the idle model on its way to REJECT; while it is away the
    # answer is UNAVAILABLE with a retry hint (it comes back by itself), never NOT_FOUND.
    assert seen[-1] == "UNAVAILABLE", seen
    assert int(away["retry-after"]) >= 1


class TestListening:
    def test_addresses(self, tmp_path):
        assert grpc_address(load([], {})) == "127.0.0.1:8001"
        assert grpc_address(load(["--port", "0"], {})) == "127.0.0.1:0"
        assert grpc_address(load(["--grpc-port", "9101"], {"CUVIL_EDGED_GRPC_PORT": "9"})) == "127.0.0.1:9101"
        assert grpc_address(load([], {"CUVIL_EDGED_GRPC_PORT": "9102"})) == "127.0.0.1:9102"
        assert grpc_address(load(["--host", "::1", "--grpc-port", "5"], {})) == "[::1]:5"
        assert grpc_address(load(["--uds", str(tmp_path / "e.sock")], {})) == f"unix:{tmp_path / 'e-grpc.sock'}"
        assert grpc_address(load(["--grpc-uds", str(tmp_path / "g")], {})) == f"unix:{tmp_path / 'g'}"
        assert grpc_address(load(["--grpc", "0"], {})) is None
        assert grpc_address(load([], {"CUVIL_EDGED_GRPC": "off"})) is None

    def test_bad_values_name_the_option(self):
        from cuvil_edge.errors import DaemonError

        with pytest.raises(DaemonError, match="--grpc-port 70000"):
            load(["--grpc-port", "70000"], {})
        with pytest.raises(DaemonError, match="--grpc-max-message-mb"):
            load(["--grpc-max-message-mb", "0"], {})

    def test_port_in_use_is_a_startup_failure(self, store, daemon_factory):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen(1)
            port = s.getsockname()[1]
            d = daemon_factory(store, "--grpc-port", str(port), ready=False)
            assert d.proc.wait(60) == 3
        assert "--grpc-port" in d.log and "gRPC" in d.log

    def test_unix_socket_and_off(self, store, tmp_path, daemon_factory, digits_data):
        sock = tmp_path / "edged-grpc.sock"
        d = daemon_factory(store, "--grpc-uds", str(sock))
        assert f"grpc+unix:{sock}" in d.log
        c = grpcclient.InferenceServerClient(f"unix:{sock}")
        try:
            inp = grpcclient.InferInput("input", [1, 1, 8, 8], "FP32")
            inp.set_data_from_numpy(np.ascontiguousarray(digits_data[:1]))
            assert c.infer("digits", [inp]).as_numpy("logits").shape == (1, 10)
        finally:
            c.close()
        assert d.stop() == 0
        assert not sock.exists()
        off = daemon_factory(store, "--grpc", "0")
        assert "grpc" not in off.log.split("ready on", 1)[1].splitlines()[0]

    def test_metrics_count_grpc_calls(self, daemon, digits_data):
        c = daemon.grpc_client()
        inp = grpcclient.InferInput("input", [1, 1, 8, 8], "FP32")
        inp.set_data_from_numpy(np.ascontiguousarray(digits_data[:1]))
        c.infer("digits", [inp])
        with pytest.raises(InferenceServerException):
            c.get_model_metadata("nope")
        import http.client

        conn = http.client.HTTPConnection(*daemon.host_port)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        assert 'cuvil_grpc_requests_total{method="ModelInfer",code="OK"} 1' in text
        assert 'cuvil_grpc_requests_total{method="ModelMetadata",code="NOT_FOUND"} 1' in text
        assert 'nv_inference_request_success{model="digits",version="1.0.0"} 1' in text


def test_sigterm_drains_grpc_calls_in_flight(store, daemon_factory, digits_data):
    """A gRPC call waiting in the batcher when SIGTERM comes is answered; then the daemon exits 0."""
    import http.client
    import signal
    import threading

    d = daemon_factory(store, "--max-queue-delay-us", "3000000")  # a lone request waits 3 s for company
    c = d.grpc_client()
    outcome: dict[str, object] = {}

    def call() -> None:
        inp = grpcclient.InferInput("input", [1, 1, 8, 8], "FP32")
        inp.set_data_from_numpy(np.ascontiguousarray(digits_data[:1]))
        try:
            outcome["logits"] = c.infer("digits", [inp], client_timeout=60).as_numpy("logits")
        except Exception as exc:  # reported below
            outcome["error"] = exc

    t = threading.Thread(target=call)
    t.start()
    deadline = time.monotonic() + 30
    queued = False
    while time.monotonic() < deadline and not queued:  # wait until the request sits in the queue
        conn = http.client.HTTPConnection(*d.host_port, timeout=10)
        conn.request("GET", "/metrics")
        queued = 'cuvil_model_queue_size{model="digits",version="1.0.0"} 1' in conn.getresponse().read().decode()
        conn.close()
        time.sleep(0.05)
    assert queued, d.log
    d.send(signal.SIGTERM)
    t.join(60)
    assert "error" not in outcome, outcome
    assert outcome["logits"].shape == (1, 10)
    assert d.proc.wait(60) == 0


def test_shared_memory_can_be_turned_off(store, daemon_factory):
    d = daemon_factory(store, "--shared-memory", "0")
    c = d.grpc_client()
    with pytest.raises(InferenceServerException, match="system shared memory is not enabled"):
        c.register_system_shared_memory("r", "/whatever", 16)
    h = d.client()
    with pytest.raises(InferenceServerException, match="system shared memory is not enabled"):
        h.register_system_shared_memory("r", "/whatever", 16)


def test_grpc_messages_count_against_the_buffered_bytes_cap_shared_with_http(store, daemon_factory):
    """--max-buffered-mb bounds request bytes held by HTTP and gRPC together: while an HTTP client holds
    most of it, a gRPC call that would pass the cap is RESOURCE_EXHAUSTED with a retry hint."""
    d = daemon_factory(store, "--max-body-mb", "2", "--max-buffered-mb", "2")
    host, port = d.url.replace("http://", "").rsplit(":", 1)
    held = socket.create_connection((host, int(port)), timeout=10)
    try:
        # Announce 1.5 MiB and send a little: the HTTP side reserves the announced length.
        held.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1572864\r\n\r\n{")
        req = _request(np.zeros((1, 1, 8, 8), np.float32))
        req.raw_input_contents.append(b"\0" * (1 << 20))  # 1 MiB more than the input needs
        with grpc.insecure_channel(d.grpc_url) as ch:
            stub = GRPCInferenceServiceStub(ch)
            deadline = time.monotonic() + 30
            while True:  # until the HTTP side has read the headers and reserved
                with pytest.raises(grpc.RpcError) as refused:
                    stub.ModelInfer(req, timeout=30)
                if refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value.details()
            assert "--max-buffered-mb" in refused.value.details()
            assert dict(refused.value.trailing_metadata() or ()).get("retry-after") == "1"
            held.close()
            deadline = time.monotonic() + 30
            while True:  # released: the same call now reaches the decoder (and is refused for its shape)
                with pytest.raises(grpc.RpcError) as after:
                    stub.ModelInfer(req, timeout=30)
                if after.value.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert after.value.code() == grpc.StatusCode.INVALID_ARGUMENT, after.value.details()
            assert stub.ServerLive(pb.ServerLiveRequest(), timeout=30).live
    finally:
        held.close()


_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # + empty SETTINGS


def _h2_answers(sock: socket.socket) -> bool:
    """True when the server answers the HTTP/2 preface with its SETTINGS frame; False when it closes."""
    sock.settimeout(20)
    try:
        head = sock.recv(9)
    except (ConnectionResetError, TimeoutError):
        return False
    return len(head) == 9 and head[3] == 0x4  # frame type 4: SETTINGS


def test_grpc_connections_over_max_connections_are_closed_before_a_byte_is_read(store, daemon_factory):
    """--max-connections caps the gRPC listener too: with 2 connections held, a third client is closed
    at once, and a slot freed is taken again. (The cap counts gRPC connections only; HTTP has its own.)"""
    d = daemon_factory(store, "--max-connections", "2")
    host, port = d.grpc_url.rsplit(":", 1)
    held = [socket.create_connection((host, int(port)), timeout=10) for _ in range(2)]
    extra: socket.socket | None = None
    try:
        for s in held:
            s.sendall(_H2_PREFACE)
            assert _h2_answers(s), "a connection under the cap got no SETTINGS frame"
        extra = socket.create_connection((host, int(port)), timeout=10)
        extra.sendall(_H2_PREFACE)
        assert not _h2_answers(extra), "a third connection over --max-connections 2 was served"
        extra.close()
        held.pop().close()
        deadline = time.monotonic() + 30
        while True:  # the server notices the close asynchronously
            with grpc.insecure_channel(d.grpc_url) as ch:
                try:
                    assert GRPCInferenceServiceStub(ch).ServerLive(pb.ServerLiveRequest(), timeout=5).live
                    break
                except grpc.RpcError:
                    if time.monotonic() > deadline:
                        raise
            time.sleep(0.5)
    finally:
        for s in held:
            s.close()
        if extra is not None:
            extra.close()


def test_a_call_whose_first_message_never_comes_ends_deadline_exceeded(store, daemon_factory, digits_data):
    """The guard's read timeout (a timer on the call's task, not asyncio.wait_for): a stream that
    sends nothing ends DEADLINE_EXCEEDED naming --request-timeout, and the call after it is served."""
    d = daemon_factory(store, "--request-timeout", "1")
    hold = threading.Event()

    def nothing():
        hold.wait(10)
        return
        yield  # a generator that sends no message

    with grpc.insecure_channel(d.grpc_url) as ch:
        stream = ch.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as silent:
            list(stream(nothing(), timeout=20))
        hold.set()
        assert silent.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "--request-timeout" in silent.value.details()
        assert 0.9 < time.monotonic() - t0 < 8
        ok = GRPCInferenceServiceStub(ch).ModelInfer(_request(digits_data[:1]), timeout=30)
        assert len(ok.raw_output_contents[0]) == 40
