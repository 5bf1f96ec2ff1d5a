"""Issue #13 acceptance: steady memory under load, and answers when file descriptors run out.

* 10,000 inference requests at concurrency 64 over keep-alive connections: 0 errors, resident
  memory after them within 10 % of the figure after warm-up.
* Under ``prlimit --nofile=128`` with 200 idle connections held open: a new client gets an answer
  (200 or 503) within 1 s, the log grows by at most a line a second, the daemon does not burn a
  core, and it is healthy afterwards.
* The accept loop's backstop, alone: a process that has no descriptor left answers each new
  client 503 from its spare descriptor and serves again once descriptors come back.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _one_client(host: str, port: int, count: int, body: bytes, errors: list[str]) -> int:
    reader, writer = await asyncio.open_connection(host, port)
    req = (b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    done = 0
    try:
        for _ in range(count):
            writer.write(req)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
            m = re.search(rb"content-length: (\d+)", head, re.I)
            payload = await reader.readexactly(int(m.group(1))) if m else b""
            if not head.startswith(b"HTTP/1.1 200"):
                errors.append(head[:80].decode(errors="replace") + payload[:200].decode(errors="replace"))
            done += 1
    finally:
        writer.close()
        await writer.wait_closed()
    return done


def _load(host: str, port: int, total: int, concurrency: int) -> tuple[int, list[str], float]:
    doc = {"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32",
                       "data": [round(i / 64, 3) for i in range(64)]}], "outputs": [{"name": "topk_classes"}]}
    body = json.dumps(doc).encode()
    errors: list[str] = []

    async def run() -> int:
        per = [total // concurrency + (1 if i < total % concurrency else 0) for i in range(concurrency)]
        done = await asyncio.gather(*(_one_client(host, port, n, body, errors) for n in per))
        return sum(done)

    t0 = time.monotonic()
    done = asyncio.run(run())
    return done, errors, time.monotonic() - t0


class TestLoad:
    def test_10000_requests_at_concurrency_64_keep_memory_flat(self, daemon):
        host, port = daemon.host_port
        done, errors, _ = _load(host, port, 2_000, 64)  # warm-up: allocator pools, batch buffers
        assert done == 2_000 and not errors, errors[:3]
        rss_start = _rss(daemon.proc.pid)
        done, errors, seconds = _load(host, port, 10_000, 64)
        rss_end = _rss(daemon.proc.pid)
        assert done == 10_000 and not errors, errors[:3]
        assert rss_end <= rss_start * 1.10, (
            f"resident memory {rss_start / 2**20:.1f} -> {rss_end / 2**20:.1f} MiB over 10,000 requests")
        print(f"10,000 requests at concurrency 64 in {seconds:.1f} s ({10_000 / seconds:.0f} req/s); "
              f"RSS {rss_start / 2**20:.1f} -> {rss_end / 2**20:.1f} MiB")


def _first_answer(host: str, port: int, timeout: float = 5.0) -> tuple[int, float]:
    """(status, seconds) of a fresh client's GET /v2/health/live."""
    t0 = time.monotonic()
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while b"\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    m = re.match(rb"HTTP/1\.1 (\d{3})", data)
    return (int(m.group(1)) if m else 0), time.monotonic() - t0


class TestFileDescriptors:
    def test_200_idle_connections_under_nofile_128(self, store, tmp_path):
        log_path = tmp_path / "daemon.log"
        env = dict(os.environ)
        env.setdefault("CUVIL_EDGE_CACHE", str(Path.home() / ".cache" / "cuvil-edge"))
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                ["prlimit", "--nofile=128:128", sys.executable, "-m", "cuvil_edge.daemon.main", "--store",
                 str(store), "--port", "0", "--max-connections", "1000"],
                stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        idle: list[socket.socket] = []
        try:
            deadline = time.monotonic() + 90
            m = None
            while time.monotonic() < deadline and m is None:
                m = re.search(r"ready on http://([\d.]+):(\d+)", log_path.read_text(errors="replace"))
                assert proc.poll() is None, log_path.read_text()
                time.sleep(0.1)
            assert m, log_path.read_text()
            host, port = m.group(1), int(m.group(2))
            for _ in range(200):
                idle.append(socket.create_connection((host, port), timeout=10))
            time.sleep(1.0)  # let the daemon accept (or refuse) all of them
            log_size = log_path.stat().st_size
            log_lines = log_path.read_text(errors="replace").count("\n")
            cpu0, t0 = _cpu_s(proc.pid), time.monotonic()
            answers = [_first_answer(host, port) for _ in range(5)]
            for status, seconds in answers:
                assert status in (200, 503), answers
                assert seconds < 1.0, answers
            time.sleep(4.0)  # the idle connections stay; nothing should spin or log meanwhile
            elapsed = time.monotonic() - t0
            cpu = _cpu_s(proc.pid) - cpu0
            lines = log_path.read_text(errors="replace").count("\n") - log_lines
            assert cpu < 0.5 * elapsed, f"daemon used {cpu:.2f} s of CPU in {elapsed:.1f} s while idle"
            assert lines <= elapsed + 1, f"the log grew {lines} lines in {elapsed:.1f} s"
            assert log_path.stat().st_size - log_size < 4096
            assert "Traceback" not in log_path.read_text(errors="replace")
            print(f"nofile=128, 200 idle: answers {[(st, round(sec, 4)) for st, sec in answers]}; "
                  f"{lines} log line(s) and {cpu:.2f} s CPU in {elapsed:.1f} s")
            for s in idle:
                s.close()
            idle.clear()
            time.sleep(0.5)
            assert _first_answer(host, port)[0] == 200
        finally:
            for s in idle:
                s.close()
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


_CHILD = r"""
import asyncio, logging, os, resource, sys, threading
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
from cuvil_edge.daemon.accept import Acceptor, listen_tcp

class Ok(asyncio.Protocol):
    def connection_made(self, transport):
        transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        transport.close()

async def main():
    loop = asyncio.get_running_loop()
    sock = listen_tcp("127.0.0.1", 0)[0]
    acceptor = Acceptor(loop, sock, Ok, retry_s=0.2, log_interval_s=10.0)
    acceptor.start()
    lines = asyncio.Queue()

    def read_stdin():  # started before the descriptors run out: no import or file needed later
        for line in sys.stdin:
            loop.call_soon_threadsafe(lines.put_nowait, line)

    threading.Thread(target=read_stdin, daemon=True).start()
    hog = []
    try:
        while True:
            hog.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    print(sock.getsockname()[1], flush=True)
    await lines.get()  # the parent says when to give them back
    for fd in hog:
        os.close(fd)
    print("exhausted", acceptor.exhausted_total, "busy", acceptor.busy_answers, flush=True)
    await lines.get()
    acceptor.close()

asyncio.run(main())
"""


def test_accept_answers_503_when_out_of_descriptors(tmp_path):
    err = tmp_path / "child.err"
    with open(err, "wb") as errf:
        child = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=errf, cwd=REPO, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        port = int(child.stdout.readline())
        cpu0 = _cpu_s(child.pid)
        t0 = time.monotonic()
        answers = [_first_answer("127.0.0.1", port) for _ in range(10)]
        assert all(status == 503 and seconds < 1.0 for status, seconds in answers), answers
        elapsed = time.monotonic() - t0
        assert _cpu_s(child.pid) - cpu0 < 0.5 * elapsed + 0.2
        child.stdin.write("\n")
        child.stdin.flush()
        report = child.stdout.readline().split()
        assert int(report[1]) >= 10 and int(report[3]) >= 10, report
        assert _first_answer("127.0.0.1", port)[0] == 200  # descriptors are back: served again
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                stream.close()
    text = err.read_text()
    assert text.count("out of file descriptors") == 1, text  # one line per 10 s, not one per client
    assert "Traceback" not in text


@pytest.mark.parametrize("configured", [4, 100_000])
def test_connection_cap_stays_below_the_file_limit(configured):
    import resource

    from cuvil_edge.daemon.accept import connection_cap

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    cap = connection_cap(configured)
    assert 1 <= cap <= configured
    if soft != resource.RLIM_INFINITY:
        assert cap < soft - len(os.listdir("/proc/self/fd"))
