"""Red-team round 3 (issue #26), HTTP: finding 4 and ``--access-log`` (finding 9).

Finding 4: four connections declaring a 64 MiB body on ``GET /v2/health/ready`` (no token needed)
held the buffered-bytes budget, so token holders got 503 until they closed. Scaled down here:
a 4 MiB body limit, an 8 MiB budget, the same four connections.
"""

from __future__ import annotations

import socket
import time

import numpy as np
import tritonclient.http as httpclient

TOKEN = "s3cret-token"


def _hold(host: str, port: int, head: bytes) -> socket.socket:
    s = socket.create_connection((host, port), timeout=10)
    s.sendall(head)  # headers only: the declared body never comes
    return s


def test_finding4_health_bodies_are_not_reserved_before_auth(store, daemon_factory, digits_data):
    d = daemon_factory(store, "--token", TOKEN, "--max-body-mb", "4", "--max-buffered-mb", "8")
    host, port = d.host_port
    holders = [_hold(host, port, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nContent-Length: 4194304\r\n\r\n")
               for _ in range(4)]
    try:
        answers = []
        for s in holders:
            s.settimeout(5)
            answers.append(s.recv(4096))
        # Refused at once, before a byte is counted, instead of waiting for 4 MiB each.
        assert all(a.startswith(b"HTTP/1.1 400 ") and b"takes no body" in a for a in answers), answers
        # A GET with a body elsewhere, token or not, is refused the same way.
        s = _hold(host, port, b"GET /v2 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode()
                  + b"\r\nTransfer-Encoding: chunked\r\n\r\n")
        s.settimeout(5)
        assert s.recv(4096).startswith(b"HTTP/1.1 400 ")
        s.close()
        # The token holder's request is served while the four are still connected.
        client = d.client()
        x = np.ascontiguousarray(np.repeat(digits_data[:1], 8, axis=0))
        inp = httpclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        out = client.infer("digits", [inp], headers={"Authorization": f"Bearer {TOKEN}"})
        assert out.as_numpy("logits").shape == (8, 10)
    finally:
        for s in holders:
            s.close()


def test_finding9_access_log_logs_each_request(store, daemon_factory, digits_data):
    d = daemon_factory(store, "--access-log", "1")
    client = d.client()
    assert client.is_server_ready()
    g = d.grpc_client()
    assert g.is_server_live()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and "ServerLive" not in d.log:
        time.sleep(0.05)
    log = d.log
    assert "GET /v2/health/ready 200" in log, log
    assert "ServerLive OK" in log, log
