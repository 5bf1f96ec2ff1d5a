"""Issue #13, daemon items 1-9: the probes that broke it, replayed against the real daemon.

Each test sends what an attacker or a careless script sent, then asserts a bound: the answer
(status, one answer only), the time it took, the daemon's memory (``VmRSS``/``VmHWM`` of the
subprocess), and that ``/v2/health/ready`` still answers 200 afterwards.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest

MiB = 1 << 20


def _status(proc_pid: int, key: str) -> int:
    """A ``/proc/<pid>/status`` figure in bytes (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{proc_pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} in /proc/{proc_pid}/status")


def _connect(daemon, timeout: float = 10.0) -> socket.socket:
    host, port = daemon.host_port
    return socket.create_connection((host, port), timeout=timeout)


def _read_answers(sock: socket.socket, timeout: float = 10.0) -> bytes:
    """Everything the server sends until it closes (or ``timeout``)."""
    sock.settimeout(timeout)
    chunks = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except (TimeoutError, ConnectionResetError):
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _statuses(data: bytes) -> list[int]:
    return [int(m) for m in re.findall(rb"^HTTP/1\.1 (\d{3}) ", data, re.M)]


def _healthy(daemon) -> bool:
    import http.client

    host, port = daemon.host_port
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", "/v2/health/ready")
        resp = conn.getresponse()
        resp.read()
        return resp.status == 200
    finally:
        conn.close()


def _request(daemon, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
             timeout: float = 30.0) -> tuple[int, bytes, dict[str, str]]:
    import http.client

    host, port = daemon.host_port
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, data, {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()


def _strict_json(data: bytes) -> object:
    def refuse(name: str) -> object:
        raise AssertionError(f"bare {name} in JSON: {data[:200]!r}")

    return json.loads(data, parse_constant=refuse)


@pytest.fixture
def token_daemon(store, daemon_factory, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    token.chmod(0o600)
    return daemon_factory(store, "--token-file", str(token), "--max-body-mb", "64", "--max-buffered-mb", "64")


class TestAuthBeforeBody:
    """Item 1: unauthenticated or over-budget bodies are refused on their headers."""

    def test_unauthenticated_bodies_are_refused_on_headers(self, token_daemon):
        d = token_daemon
        rss0 = _status(d.proc.pid, "VmRSS")
        socks = []
        try:
            for _ in range(16):
                s = _connect(d)
                s.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Expect: 100-continue\r\nContent-Length: 62914560\r\n\r\n")
                socks.append(s)
            for s in socks:
                head = _read_answers(s, timeout=5.0)
                # One answer, 401, no "100 Continue" before it, and the connection closes.
                assert _statuses(head) == [401], head[:200]
                assert b"www-authenticate: Bearer" in head
            # Bodies sent anyway are read and dropped, never kept.
            chunk = b"x" * MiB
            for s in socks:
                for _ in range(8):
                    try:
                        s.sendall(chunk)
                    except OSError:
                        break
        finally:
            for s in socks:
                s.close()
        grown = _status(d.proc.pid, "VmHWM") - rss0
        assert grown < 32 * MiB, f"daemon grew {grown / MiB:.0f} MiB on unauthenticated bodies"
        assert _healthy(d)

    def test_bearer_scheme_is_case_insensitive(self, token_daemon):
        for scheme in ("Bearer", "bearer", "BEARER"):
            status, _, _ = _request(token_daemon, "GET", "/v2/models/digits",
                                    headers={"Authorization": f"{scheme} s3cret-token"})
            assert status == 200, scheme
        status, _, headers = _request(token_daemon, "GET", "/v2/models/digits",
                                      headers={"Authorization": "Basic s3cret-token"})
        assert status == 401 and headers["www-authenticate"].startswith("Bearer")

    def test_total_buffered_bytes_are_capped(self, token_daemon):
        # 16 authenticated clients each announce 30 MiB; the 64 MiB total admits two.
        d = token_daemon
        rss0 = _status(d.proc.pid, "VmRSS")
        socks, answers = [], []
        try:
            for _ in range(16):
                s = _connect(d)
                s.sendall(b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret-token\r\n"
                          b"Content-Type: application/json\r\nContent-Length: 31457280\r\n\r\n")
                socks.append(s)
            t0 = time.monotonic()
            for s in socks:
                s.settimeout(0.5)
                try:
                    answers.append(s.recv(4096))
                except TimeoutError:
                    answers.append(b"")  # admitted: waiting for its body
            refused = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
            assert len(refused) == 14, [a[:40] for a in answers]
            assert all(b"retry-after: 1" in a for a in refused)
            assert time.monotonic() - t0 < 10
            # The two admitted ones send their bodies: the JSON bound refuses them (413), unparsed.
            for s, a in zip(socks, answers, strict=True):
                if not a:
                    s.settimeout(30)
                    s.sendall(b"[" + b"1," * (15 * MiB - 2) + b"11]")  # exactly 30 MiB
                    assert _statuses(_read_answers(s, 30)) == [413]
        finally:
            for s in socks:
                s.close()
        grown = _status(d.proc.pid, "VmHWM") - rss0
        assert grown < 160 * MiB, f"daemon grew {grown / MiB:.0f} MiB (cap 64 MiB buffered)"
        assert _healthy(d)
        status, text, _ = _request(d, "GET", "/metrics", headers={"Authorization": "Bearer s3cret-token"})
        assert 'cuvil_http_refused_total{reason="buffered"} 14' in text.decode()
        assert "cuvil_http_buffered_bytes 0" in text.decode()


class TestBackpressure:
    """Item 2: a client that pipelines and never reads costs a bounded amount and stalls nobody."""

    def test_pipelining_client_that_never_reads(self, store, daemon_factory):
        d = daemon_factory(store, "--request-timeout", "5")
        rss0 = _status(d.proc.pid, "VmRSS")
        flood = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 50_000
        s = _connect(d)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sent = [0]

        def push() -> None:
            s.settimeout(15)
            view = memoryview(flood)
            try:
                while sent[0] < len(flood):
                    sent[0] += s.send(view[sent[0]:sent[0] + 65536])
            except OSError:
                pass

        pusher = threading.Thread(target=push, daemon=True)
        pusher.start()
        try:
            time.sleep(1.0)
            worst = 0.0
            for _ in range(20):
                t0 = time.monotonic()
                assert _healthy(d)
                worst = max(worst, time.monotonic() - t0)
            assert worst < 1.0, f"another client waited {worst:.2f} s"
            grown = _status(d.proc.pid, "VmHWM") - rss0
            assert grown < 48 * MiB, f"daemon grew {grown / MiB:.0f} MiB for a client that does not read"
            # Loopback buffers may swallow all 1.7 MB; what counts is how much the daemon served.
            _, text, _ = _request(d, "GET", "/metrics")
            answered = int(re.search(rb"^cuvil_http_requests_total (\d+)", text, re.M).group(1))
            assert answered < 5_000, f"the daemon answered {answered} of 50,000 unread requests"
            # The client that never reads is closed after --request-timeout.
            deadline = time.monotonic() + 30
            closed = False
            while time.monotonic() < deadline and not closed:
                closed = _other_connections(d) == 0
                time.sleep(0.5)
            assert closed, "the non-reading client was never closed"
        finally:
            s.close()
            pusher.join(20)
        assert _healthy(d)


def _other_connections(daemon) -> int:
    """Open connections besides the one asking."""
    _, text, _ = _request(daemon, "GET", "/metrics")
    m = re.search(rb"^cuvil_server_connections (\d+)", text, re.M)
    assert m
    return int(m.group(1)) - 1


class TestJsonBeforeParsing:
    """Items 4, 6, 7: JSON judged by size and depth before parsing; no 500 for a client's error."""

    def test_huge_json_for_a_small_input_is_refused_fast(self, daemon):
        body = b'{"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [' \
               + b"0.5," * (14 * MiB // 4) + b'0.5]}]}'
        rss0 = _status(daemon.proc.pid, "VmRSS")
        results: list[tuple[int, float]] = []

        def one() -> None:
            t0 = time.monotonic()
            status, _, _ = _request(daemon, "POST", "/v2/models/digits/infer", body,
                                    {"Content-Type": "application/json"})
            results.append((status, time.monotonic() - t0))

        threads = [threading.Thread(target=one) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert [r[0] for r in results] == [413] * 4
        assert max(r[1] for r in results) < 10.0  # it was 4.9 s each, parsed; now refused unparsed
        grown = _status(daemon.proc.pid, "VmHWM") - rss0
        assert grown < 160 * MiB, f"grew {grown / MiB:.0f} MiB for four 14 MiB bodies (was +2 GB)"
        assert _healthy(daemon)

    def test_deep_nesting_is_400(self, daemon):
        body = b'{"inputs": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"
        status, text, _ = _request(daemon, "POST", "/v2/models/digits/infer", body)
        assert status == 400 and b"levels deep" in text
        status, text, _ = _request(daemon, "POST", "/v2/repository/index", b"[" * 30_000)
        assert status == 400
        assert "Traceback" not in daemon.log and "RecursionError" not in daemon.log
        assert _healthy(daemon)

    def test_output_parameters_of_the_wrong_type_is_400(self, daemon):
        doc = {"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0.0] * 64}],
               "outputs": [{"name": "logits", "parameters": [1, 2]}]}
        status, text, _ = _request(daemon, "POST", "/v2/models/digits/infer", json.dumps(doc).encode())
        assert status == 400 and b"'parameters' must be an object" in text
        doc["outputs"] = [{"name": {"a": 1}}]  # found by tests/fuzz/fuzz_kserve_request.py: was a 500
        status, text, _ = _request(daemon, "POST", "/v2/models/digits/infer", json.dumps(doc).encode())
        assert status == 400 and b"unexpected inference output" in text
        assert "Traceback" not in daemon.log

    def test_nan_in_input_is_400_and_nothing_non_json_comes_out(self, daemon):
        body = b'{"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [NaN' \
               + b", 0" * 63 + b"]}]}"
        status, text, _ = _request(daemon, "POST", "/v2/models/digits/infer", body)
        assert status == 400 and b"not a JSON number" in text
        _strict_json(text)

    def test_non_finite_outputs_are_strict_json_and_read_back(self, tmp_path, digits_model, bundle_maker,
                                                              installer, daemon_factory):
        root = tmp_path / "raw-store"
        root.mkdir()
        installer(root, bundle_maker(tmp_path / "raw", digits_model, "raw", "1.0.0"))
        d = daemon_factory(root)
        x = np.full((1, 1, 8, 8), 3e38, np.float32)
        doc = {"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32",
                           "data": x.ravel().tolist()}], "outputs": [{"name": "logits"}]}
        status, text, _ = _request(d, "POST", "/v2/models/raw/infer", json.dumps(doc).encode())
        assert status == 200
        out = _strict_json(text)["outputs"][0]["data"]  # type: ignore[index]
        assert any(isinstance(v, str) for v in out), "the probe should overflow the logits"
        # tritonclient reads the strings back as IEEE values, as the binary answer carries them.
        import tritonclient.http as httpclient

        c = d.client()
        inp = httpclient.InferInput("input", [1, 1, 8, 8], "FP32")
        inp.set_data_from_numpy(x, binary_data=False)
        as_json = c.infer("raw", [inp], outputs=[httpclient.InferRequestedOutput("logits", binary_data=False)])
        as_bin = c.infer("raw", [inp], outputs=[httpclient.InferRequestedOutput("logits", binary_data=True)])
        np.testing.assert_array_equal(as_json.as_numpy("logits"), as_bin.as_numpy("logits"))
        assert not np.isfinite(as_bin.as_numpy("logits")).all()


class TestRepository:
    """Item 5: failed loads leave no state; long names are a 400 without the store's path."""

    def test_random_loads_leave_no_index_entries(self, daemon):
        rng = np.random.default_rng(0)
        before = len(json.loads(_request(daemon, "POST", "/v2/repository/index")[1]))
        for _ in range(300):
            name = "".join(rng.choice(list("abcdefghij0123456789"), 12))
            status, text, _ = _request(daemon, "POST", f"/v2/repository/models/{name}/load")
            assert status == 400 and b"not in the store" in text
        after = len(json.loads(_request(daemon, "POST", "/v2/repository/index")[1]))
        assert after == before == 1
        assert "Traceback" not in daemon.log

    @pytest.mark.parametrize("name", ["x" * 19_000, "..", "%2e%2e", "a%2Fb", "current", "-rf"])
    def test_bad_names_are_400_without_paths(self, daemon, name):
        status, text, _ = _request(daemon, "POST", f"/v2/repository/models/{name}/load")
        assert status == 400, (status, text[:200])
        assert str(daemon.store) not in text.decode() and len(text) < 600
        status, text, _ = _request(daemon, "GET", f"/v2/models/{name}/ready")
        assert status in (400, 404) and str(daemon.store) not in text.decode()
        assert "Traceback" not in daemon.log
        assert _healthy(daemon)

    def test_config_shows_no_absolute_path(self, daemon):
        status, text, _ = _request(daemon, "GET", "/v2/models/digits/config")
        assert status == 200
        assert str(daemon.store) not in text.decode()
        cfg = json.loads(text)
        assert cfg["parameters"]["cuvil.bundle"]["string_value"] == "bundles/digits/1.0.0"


class TestFraming:
    """Items 8 and 9: exactly one answer per request, HEAD without body, 405, 431."""

    def test_head_has_no_body(self, daemon):
        s = _connect(daemon)
        try:
            s.sendall(b"HEAD /v2 HTTP/1.1\r\nHost: x\r\n\r\nGET /v2/health/live HTTP/1.1\r\nHost: x\r\n"
                      b"Connection: close\r\n\r\n")
            data = _read_answers(s)
        finally:
            s.close()
        head, _, rest = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and int(re.search(rb"content-length: (\d+)", head).group(1)) > 0
        assert rest.startswith(b"HTTP/1.1 200"), "the HEAD answer carried a body"
        status, body, headers = _request(daemon, "HEAD", "/v2/models/digits")
        assert status == 200 and body == b"" and int(headers["content-length"]) > 0

    @pytest.mark.parametrize("request_bytes, status", [
        (b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\nGARBAGE", 200),
        (b"GET /v2 HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
         b"Sec-WebSocket-Version: 13\r\n\r\n\x81\x85abcd", 200),
        (b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n\x16\x03\x01", 405),
    ])
    def test_upgrade_and_connect_get_one_answer(self, daemon, request_bytes, status):
        s = _connect(daemon)
        try:
            s.sendall(request_bytes)
            data = _read_answers(s)
        finally:
            s.close()
        assert _statuses(data) == [status], data[:300]
        assert b"connection: close" in data
        assert _healthy(daemon)

    @pytest.mark.parametrize("path", ["/v2/health/live", "/v2/health/ready", "/v2", "/metrics",
                                      "/v2/models/digits", "/v2/models/digits/ready"])
    def test_post_to_get_routes_is_405(self, daemon, path):
        status, _, headers = _request(daemon, "POST", path, b"{}")
        assert status == 405 and headers.get("allow") == "GET, HEAD"

    def test_oversized_header_is_431(self, daemon):
        s = _connect(daemon)
        try:
            s.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (100 * 1024) + b"\r\n\r\n")
            data = _read_answers(s)
        finally:
            s.close()
        assert _statuses(data) == [431] and b"User callback error" not in data
        assert _healthy(daemon)

    def test_client_errors_leave_no_traceback(self, daemon):
        for body in (b"{", b"[1,2]", b'{"inputs": "x"}', b'{"inputs": [{"name": "input"}]}'):
            _request(daemon, "POST", "/v2/models/digits/infer", body)
        assert "Traceback" not in daemon.log
