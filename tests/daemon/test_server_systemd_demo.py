"""sd_notify protocol as systemd sees it (a real datagram socket), and the demo entry point."""

from __future__ import annotations

import signal
import socket
import time

import numpy as np
import tritonclient.http as httpclient
from polling import wait_until


def _drain(sock: socket.socket, messages: list[tuple[float, str]]) -> None:
    while True:
        try:
            data = sock.recv(4096)
        except BlockingIOError:
            return
        messages.append((time.monotonic(), data.decode()))


def test_sd_notify_ready_after_warmup_watchdog_and_stopping(tmp_path, store, daemon_factory, digits_data):
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.setblocking(False)
    messages: list[tuple[float, str]] = []
    try:
        d = daemon_factory(store, "--tick", "0.1", env={"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "400000"},
                           ready=False)
        deadline = time.monotonic() + 60
        while not any("READY=1" in m for _, m in messages) and time.monotonic() < deadline:
            _drain(sock, messages)
            time.sleep(0.02)
        ready_at = next(t for t, m in messages if "READY=1" in m)
        d.wait_ready()
        # READY=1 only once the model is loaded and warmed: it is served at that instant.
        inp = httpclient.InferInput("input", [1, 1, 8, 8], "FP32")
        inp.set_data_from_numpy(np.ascontiguousarray(digits_data[:1]))
        assert d.client().infer("digits", [inp]).as_numpy("logits").shape == (1, 10)
        ready_msg = next(m for _, m in messages if "READY=1" in m)
        assert "STATUS=serving 1 model(s)" in ready_msg
        # SIGHUP: RELOADING=1 (with MONOTONIC_USEC for Type=notify-reload), then READY=1 again.
        d.send(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while sum("READY=1" in m for _, m in messages) < 2 and time.monotonic() < deadline:
            _drain(sock, messages)
            time.sleep(0.02)
        reload_msgs = [m for _, m in messages if "RELOADING=1" in m]
        assert reload_msgs and "MONOTONIC_USEC=" in reload_msgs[0]
        assert sum("READY=1" in m for _, m in messages) == 2
        before = [m for t, m in messages if t < ready_at]
        assert not any("WATCHDOG=1" in m for m in before)
        assert any(m.startswith("STATUS=loading models") for m in before)

        def three_pings() -> bool:
            _drain(sock, messages)
            return sum(m == "WATCHDOG=1" for _, m in messages) >= 3

        wait_until(three_pings, "three watchdog pings (WATCHDOG_USEC=400000)", timeout=20)
        d.send(signal.SIGTERM)
        assert d.proc.wait(30) == 0
        _drain(sock, messages)
        assert any("STOPPING=1" in m for _, m in messages)
    finally:
        sock.close()


def test_serve_and_measure(tmp_path, digits_model, digits_data, bundle_maker):
    from cuvil_edge.loadgen import serve_and_measure

    bundle = bundle_maker(tmp_path / "bundle", digits_model, "digits", "1.0.0", sample=digits_data[:4],
                          postprocess={"kind": "classification", "top_k": 5})
    res = serve_and_measure(bundle, board="orin-nano-8gb", requests=60, concurrency=3)
    assert res["model"] == "digits" and res["version"] == "1.0.0"
    assert res["errors"] == 0 and res["exit_code"] == 0
    assert res["throughput_rps"] > 0 and 0 < res["p50_ms"] <= res["p99_ms"]
    assert res["server"]["inferences"] >= 60
    assert res["board_metrics"]["cuvil_memory_budget_bytes"] > 0
