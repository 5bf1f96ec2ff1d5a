"""Red-team round 3 (issue #26), gRPC: findings 2, 3, 5 and the gRPC parts of 9.

The attacks are replayed byte by byte with raw HTTP/2 frames (``h2raw``): a stock gRPC client
never stops after its headers, resets streams as fast as it can, or leaves its answers unread.
Memory figures are the daemon subprocess's ``VmRSS`` sampled every 10 ms during the attack, and
the attacks are scaled down from the report (tens of MB, limits set low) to keep CI light.
"""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import grpc
import h2raw
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from cuvil_edge.daemon.proto import grpc_service_pb2 as pb
from cuvil_edge.daemon.proto.grpc_service_pb2_grpc import GRPCInferenceServiceStub

TOKEN = "s3cret-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
MiB = 1 << 20


@contextmanager
def peak_rss(d):
    """Yields a list whose first item becomes the daemon's peak VmRSS growth (bytes) over the block."""
    base = d.rss_kb()
    peak = [base]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], d.rss_kb())
            time.sleep(0.01)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out = [0]
    try:
        yield out
    finally:
        stop.set()
        t.join()
        out[0] = (peak[0] - base) * 1024
        print(f"peak VmRSS growth {out[0] / MiB:.1f} MiB")


def _request(x: np.ndarray, model: str = "digits") -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name=model)
    t = req.inputs.add(name="input", datatype="FP32")
    t.shape.extend(x.shape)
    req.raw_input_contents.append(np.ascontiguousarray(x, np.float32).tobytes())
    return req


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def _infer(d, x, headers=AUTH):
    client = d.grpc_client()
    inp = grpcclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(np.ascontiguousarray(x))
    return client.infer("digits", [inp], headers=headers).as_numpy("logits")


def _stream_ends(frames) -> set[int]:
    """Stream ids the server ended (END_STREAM on HEADERS, or RST_STREAM)."""
    return {sid for kind, flags, sid, _ in frames
            if (kind == h2raw.HEADERS and flags & h2raw.END_STREAM) or kind == h2raw.RST_STREAM}


def test_finding2_half_open_health_streams_do_not_stop_grpc(store, daemon_factory, digits_data):
    d = daemon_factory(store, "--token", TOKEN, "--grpc-max-rpcs", "16")
    socks = [h2raw.connect(d.grpc_url) for _ in range(3)]
    try:
        for s in socks:  # 36 half-open health streams, headers only, over 3 connections (> 16)
            s.sendall(b"".join(h2raw.grpc_headers(1 + 2 * i, "ServerLive" if i % 2 else "ServerReady")
                               for i in range(12)))
        # Each was answered from its headers, without waiting for a message, and holds nothing.
        for s in socks:
            assert _stream_ends(h2raw.read_frames(s, 2.0)) >= {1 + 2 * i for i in range(12)}
        with grpc.insecure_channel(d.grpc_url) as ch:
            stub = GRPCInferenceServiceStub(ch)
            assert stub.ServerLive(pb.ServerLiveRequest(), timeout=5).live
            assert stub.ServerReady(pb.ServerReadyRequest(), timeout=5).ready
        assert _infer(d, digits_data[:2]).shape == (2, 10)
    finally:
        for s in socks:
            s.close()


def test_finding2_half_open_calls_time_out_and_over_max_rpcs_is_resource_exhausted(store, daemon_factory,
                                                                                    digits_data):
    """Token holders' half-open calls hold their share only until --request-timeout; a call over
    --grpc-max-rpcs is RESOURCE_EXHAUSTED naming the option (finding 9: grpcio said INTERNAL or
    'Concurrent RPC limit exceeded!'), and health is served throughout."""
    d = daemon_factory(store, "--token", TOKEN, "--grpc-max-rpcs", "8", "--request-timeout", "1.5")
    s = h2raw.connect(d.grpc_url)
    try:
        s.sendall(b"".join(h2raw.grpc_headers(1 + 2 * i, "ModelInfer", TOKEN) for i in range(8)))
        time.sleep(0.3)
        with pytest.raises(InferenceServerException) as over:
            _infer(d, digits_data[:1])
        assert over.value.status() == "StatusCode.RESOURCE_EXHAUSTED" and "--grpc-max-rpcs 8" in str(over.value)
        assert d.grpc_client().is_server_live()
        frames = h2raw.read_frames(s, 3.0)  # the eight end with DEADLINE_EXCEEDED after 1.5 s
        assert _stream_ends(frames) >= {1 + 2 * i for i in range(8)}
        assert _infer(d, digits_data[:2]).shape == (2, 10)
    finally:
        s.close()


def test_finding3_large_health_messages_are_not_buffered(store, daemon_factory):
    d = daemon_factory(store, "--token", TOKEN, "--max-body-mb", "8")
    with grpc.insecure_channel(d.grpc_url, options=[("grpc.max_send_message_length", -1)]) as ch:
        live = ch.unary_unary("/inference.GRPCInferenceService/ServerLive")
        # A valid 8 MiB ServerLiveRequest (one unknown length-delimited field), as the report sent 60 MB.
        payload = b"\xff" * (8 * MiB - 16)
        blob = pb.ServerLiveRequest().SerializeToString() + b"\x7a" + _varint(len(payload)) + payload
        assert pb.ServerLiveRequest.FromString(blob) is not None
        with peak_rss(d) as grew:
            calls = [live.future(blob, timeout=30) for _ in range(16)]
            for c in calls:
                assert pb.ServerLiveResponse.FromString(c.result()).live
        assert grew[0] < 48 * MiB, f"16 x 8 MiB health calls grew the daemon by {grew[0] / MiB:.0f} MiB"


def test_finding9_grpc_errors_do_not_echo_unbounded_input(store, daemon_factory):
    d = daemon_factory(store)
    req = pb.ModelInferRequest(model_name="digits")
    t = req.inputs.add(name="input", datatype="FP32")
    t.shape.extend([1] * 2_000_000)
    req.raw_input_contents.append(b"\0" * 4)
    with grpc.insecure_channel(d.grpc_url) as ch:
        with pytest.raises(grpc.RpcError) as err:
            GRPCInferenceServiceStub(ch).ModelInfer(req, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
    assert "unexpected shape" in err.value.details() and len(err.value.details()) <= 1100


# ---------------------------------------------------------------------- finding 5: slow readers


def _big_output_model(path: Path, per_item: int) -> Path:
    """digits-shaped input [N,1,8,8] -> [N, per_item/256, 8, 8] float32: a large answer per request."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    ch = per_item // 256
    graph = helper.make_graph(
        [helper.make_node("Expand", ["input", "shape"], ["logits"])], "big",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", ch, 8, 8])],
        [numpy_helper.from_array(np.array([1, ch, 8, 8], np.int64), "shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture
def big_store(tmp_path, digits_data, bundle_maker, installer):
    root = tmp_path / "bigstore"
    root.mkdir()
    model = _big_output_model(tmp_path / "big.onnx", MiB)
    installer(root, bundle_maker(tmp_path / "src" / "big", model, "digits", "1.0.0", sample=digits_data[:2]))
    return root


def _warm(d, msg: bytes, n: int) -> None:
    """``n`` concurrent calls whose answers are read: the runtime's own buffers, grown once."""
    with grpc.insecure_channel(d.grpc_url, options=[("grpc.max_receive_message_length", -1)]) as ch:
        infer = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        calls = [infer.future(msg, metadata=tuple(AUTH.items()), timeout=30) for _ in range(n)]
        assert all(len(c.result()) > MiB for c in calls)


def test_finding5_stream_answers_a_client_does_not_read_are_bounded(big_store, daemon_factory, digits_data):
    """100 requests with 1 MiB answers on a stream that is never read hold at most the stream's
    send queue (16 MiB) beyond what reading them costs, and the stream is dropped after
    --request-timeout (docs/daemon.md said flow control held the client back: it held nothing)."""
    d = daemon_factory(big_store, "--token", TOKEN, "--request-timeout", "2", "--keep-alive", "1")
    msg = _request(digits_data[:1]).SerializeToString()
    _warm(d, msg, 8)
    s = h2raw.connect(d.grpc_url)
    try:
        with peak_rss(d) as grew:
            s.sendall(h2raw.grpc_headers(1, "ModelStreamInfer", TOKEN)
                      + b"".join(h2raw.grpc_data(1, msg) for _ in range(100)))
            time.sleep(4)  # past --request-timeout: the stream is cancelled
        assert grew[0] < 40 * MiB, f"a stream not read grew the daemon by {grew[0] / MiB:.0f} MiB"
        # It never answered a keep-alive ping: the connection is closed, and what it held freed.
        frames = h2raw.read_frames(s, 6.0)
        assert h2raw.GOAWAY in {kind for kind, *_ in frames}
    finally:
        s.close()
    assert _infer(d, digits_data[:1]).shape == (1, MiB // 256, 8, 8)


def test_finding5_unary_answers_not_read_are_bounded_and_time_out(big_store, daemon_factory, digits_data):
    """20 calls whose 4 MiB answers are never read cost the daemon at most its --max-buffered-mb
    (16 MiB here) beyond what the same calls cost when read (the runtime's own buffers), plus
    the copies of the answers being serialized (measured 16-33 MiB; 213 MiB without the guard)."""
    d = daemon_factory(big_store, "--token", TOKEN, "--request-timeout", "2", "--max-body-mb", "4",
                       "--max-buffered-mb", "16")
    msg = _request(digits_data[:4]).SerializeToString()  # 4 MiB answers
    _warm(d, msg, 1)  # one 4 MiB answer at a time fits 16 MiB (counted ANSWER_COPIES times)
    s = h2raw.connect(d.grpc_url)
    try:
        with peak_rss(d) as grew:
            s.sendall(b"".join(h2raw.grpc_headers(1 + 2 * i, "ModelInfer", TOKEN)
                               + h2raw.grpc_data(1 + 2 * i, msg, end_stream=True) for i in range(20)))
            time.sleep(4)
        assert grew[0] < 48 * MiB, f"20 unread 4 MiB answers grew the daemon by {grew[0] / MiB:.0f} MiB"
        # Once their write timed out, the budget is free again for a client that reads.
        assert _infer(d, digits_data[:4]).shape == (4, MiB // 256, 8, 8)
    finally:
        s.close()


def _returned(d, base_kb: int, within: float, timeout: float = 10.0) -> float:
    """Poll until the daemon's VmRSS is at most ``within`` bytes over ``base_kb``; the growth left."""
    deadline = time.monotonic() + timeout
    while (d.rss_kb() - base_kb) * 1024 > within and time.monotonic() < deadline:
        time.sleep(0.2)  # the heap is trimmed at the next tick after a dropped answer
    return (d.rss_kb() - base_kb) * 1024


@pytest.mark.parametrize("kind", ["unary", "streams"])
def test_finding5_unread_answers_cost_at_most_the_share_and_are_returned(big_store, daemon_factory, digits_data,
                                                                          kind):
    """Token holder, never reads, then hangs up: 40 unary ModelInfer calls, or 12 ModelStreamInfer
    streams of 100 requests, each answer 4 MiB, with --max-buffered-mb 64. The daemon grows by at
    most the share plus 16 MiB while they are held (a gRPC answer costs about three times its
    size at its peak: counted once, the unary calls grew it by 137 MiB, and each stream held its
    own 16 MiB whatever the budget: 282 MiB), gives the memory back once the client left (it kept
    all of it), and logs no ERROR for a client that hung up (grpcio's ExecuteBatchError did)."""
    share = 64 * MiB
    d = daemon_factory(big_store, "--token", TOKEN, "--max-body-mb", "4", "--max-buffered-mb", "64")
    msg = _request(digits_data[:4]).SerializeToString()  # 4 MiB answers
    _warm(d, msg, 4)
    base = d.rss_kb()
    s = h2raw.connect(d.grpc_url)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        with peak_rss(d) as grew:
            if kind == "unary":
                s.sendall(b"".join(h2raw.grpc_headers(1 + 2 * i, "ModelInfer", TOKEN)
                                   + h2raw.grpc_data(1 + 2 * i, msg, end_stream=True) for i in range(40)))
            else:
                for k in range(12):
                    s.sendall(h2raw.grpc_headers(1 + 2 * k, "ModelStreamInfer", TOKEN)
                              + b"".join(h2raw.grpc_data(1 + 2 * k, msg) for _ in range(100)))
            time.sleep(4)
        assert grew[0] <= share + 16 * MiB, f"unread answers grew the daemon by {grew[0] / MiB:.0f} MiB"
    finally:
        s.close()
    left = _returned(d, base, 16 * MiB)
    assert left <= 16 * MiB, f"{left / MiB:.0f} MiB not returned after the client left"
    assert _infer(d, digits_data[:4]).shape == (4, MiB // 256, 8, 8)
    errors = [line for line in d.log.splitlines() if " ERROR " in line]
    assert not errors, errors


def _http_infer_request(x: np.ndarray) -> bytes:
    import json

    header = json.dumps({"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    body = header + np.ascontiguousarray(x, np.float32).tobytes()
    return (b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode()
            + b"\r\nInference-Header-Content-Length: " + str(len(header)).encode()
            + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def test_finding5_http_answers_not_read_are_bounded_and_returned(big_store, daemon_factory, digits_data):
    """20 HTTP connections whose 4 MiB answers are never read hold at most --max-buffered-mb (16 MiB)
    beyond what reading them costs; once dropped after --request-timeout, the memory is returned
    (the report: 3.8 GB held, 3.9 GB still resident after they closed)."""

    d = daemon_factory(big_store, "--token", TOKEN, "--request-timeout", "2", "--max-body-mb", "4",
                       "--max-buffered-mb", "16")
    request = _http_infer_request(digits_data[:4])
    host, port = d.host_port
    for _ in range(2):  # the runtime's own buffers, warmed up by clients that read
        with socket.create_connection((host, port), timeout=10) as s:
            s.sendall(request)
            got = b""
            while len(got) < 4 * MiB:
                chunk = s.recv(1 << 20)
                assert chunk
                got += chunk
    base = d.rss_kb()
    socks = []
    try:
        with peak_rss(d) as grew:
            for _ in range(20):
                s = socket.create_connection((host, port), timeout=10)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.sendall(request)
                socks.append(s)
            time.sleep(1.5)
        assert grew[0] < 32 * MiB, f"20 unread 4 MiB HTTP answers grew the daemon by {grew[0] / MiB:.0f} MiB"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (d.rss_kb() - base) * 1024 > 8 * MiB:
            time.sleep(0.2)  # dropped after --request-timeout; the heap is trimmed at the next tick
        assert (d.rss_kb() - base) * 1024 <= 8 * MiB, f"{(d.rss_kb() - base) / 1024:.0f} MiB not returned"
    finally:
        for s in socks:
            s.close()
    assert _infer(d, digits_data[:4]).shape == (4, MiB // 256, 8, 8)


def test_finding9_rapid_reset_without_ping_answers_gets_goaway(store, daemon_factory, digits_data):
    """HEADERS + RST_STREAM as fast as possible, no token, PINGs never answered: GOAWAY within
    --request-timeout (grpcio alone sent none for 311k streams in 15 s), and others are served."""
    d = daemon_factory(store, "--token", TOKEN, "--request-timeout", "2")
    s = h2raw.connect(d.grpc_url)
    s.settimeout(5)
    kinds: set[int] = set()
    sid, deadline = 1, time.monotonic() + 8
    try:
        while h2raw.GOAWAY not in kinds and time.monotonic() < deadline:
            batch = b"".join(h2raw.grpc_headers(sid + 2 * i, "ServerLive") + h2raw.rst(sid + 2 * i)
                             for i in range(100))
            sid += 200
            try:
                s.sendall(batch)
            except (BrokenPipeError, ConnectionResetError):
                break
            kinds |= {kind for kind, *_ in h2raw.read_frames(s, 0.05)}
        kinds |= {kind for kind, *_ in h2raw.read_frames(s, 1.0)}
    finally:
        s.close()
    assert h2raw.GOAWAY in kinds, f"no GOAWAY after {sid // 2} reset streams"
    assert _infer(d, digits_data[:1]).shape == (1, 10)
