"""A KServe v2 load generator: serve a bundle with the real daemon and measure it with tritonclient.

:func:`serve_and_measure` starts ``cuvil-edged`` as a subprocess on an ephemeral loopback port
with simulated telemetry of a board (``--telemetry sim:<board>``), waits until it reports ready,
sends binary-tensor requests from ``concurrency`` client threads, reads the daemon's statistics
and metrics, stops it with SIGTERM and returns the figures. ``cuvil-edge demo`` uses it.

It is a client, not part of the daemon: it lives outside ``cuvil_edge.daemon`` so a board install
does not need ``tritonclient``, which comes with the ``client`` extra
(``pip install 'cuvil-edge[client]'``) and is imported only when a measurement starts.
"""

from __future__ import annotations

import contextlib
import http.client
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from cuvil_edge.errors import CuvilEdgeError, DaemonError

__all__ = ["ClientMissing", "serve_and_measure", "start_daemon"]

CLIENT_EXTRA = "pip install 'cuvil-edge[client]'"


class ClientMissing(CuvilEdgeError):
    """``tritonclient`` is not installed here; the message names the extra that brings it."""


def _import_httpclient() -> Any:
    from cuvil_edge._optional import optional_import

    return optional_import("tritonclient.http", needed_for="the load generator",
                           install=f"install it with: {CLIENT_EXTRA}", error=ClientMissing)


def _prepare_store(source: Path, tmp: Path) -> Path:
    from cuvil_edge.bundle.layout import StoreLayout

    source = Path(source)
    if Path(StoreLayout.of(source).bundles_dir).is_dir():
        return source
    from cuvil_edge.daemon.store import BundleStore

    root = tmp / "store"
    root.mkdir()
    # A benchmark of serving: the bundle is the caller's own, its signer is not what is measured.
    BundleStore(root).install(source, allow_unsigned=True)
    return root


def start_daemon(store: Path, *args: str, timeout: float = 120.0, log_path: Path | None = None,
                 ) -> tuple[subprocess.Popen[bytes], str, Path]:
    """Start ``cuvil-edged --store STORE --port 0 ARGS`` and wait for its ready line.

    Returns:
        (process, "host:port", log file).

    Raises:
        DaemonError: it exited or did not become ready in time (the log tail is in the message).
    """
    log_path = log_path or Path(tempfile.mkstemp(prefix="cuvil-edged-", suffix=".log")[1])
    cmd = [sys.executable, "-m", "cuvil_edge.daemon.main", "--store", str(store), "--port", "0", *args]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace")
        m = re.search(r"ready on http://(\S+?)(,|\s)", text)
        if m:
            return proc, m.group(1), log_path
        if proc.poll() is not None:
            raise DaemonError(f"cuvil-edged exited with {proc.returncode} before it was ready:\n{text[-2000:]}")
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise DaemonError(f"cuvil-edged was not ready after {timeout:.0f} s; log {log_path}")


def _inputs_for(bundle_dir: Path, meta: dict[str, Any]) -> dict[str, np.ndarray]:
    from cuvil_edge.runtime.base import dtype_of

    sample = bundle_dir / "sample" / "inputs.npz"
    feed: dict[str, np.ndarray] = {}
    if sample.is_file():
        with np.load(sample) as npz:
            for inp in meta["inputs"]:
                if inp["name"] in npz.files:
                    feed[inp["name"]] = np.ascontiguousarray(npz[inp["name"]][:1])
    rng = np.random.default_rng(0)
    for inp in meta["inputs"]:
        if inp["name"] in feed or inp["name"] == "image":
            continue
        shape = [1 if d < 0 else d for d in inp["shape"]]
        feed[inp["name"]] = rng.random(shape).astype(dtype_of(inp["datatype"]))
    return feed


def _get(url: str, path: str) -> tuple[int, bytes]:
    host, _, port = url.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def serve_and_measure(bundle_dir_or_store: Path, board: str = "orin-nano-8gb", requests: int = 200,
                      concurrency: int = 4, model: str | None = None) -> dict[str, Any]:
    """Start the daemon on a bundle (or a store), send requests with tritonclient, stop it.

    Args:
        bundle_dir_or_store (Path): an extracted bundle directory, a ``.cvb`` file, or a store
            root (holding ``bundles/``).
        board (str): board profile the simulated telemetry and memory budget follow. Defaults to
            ``"orin-nano-8gb"``.
        requests (int): requests to send in total. Defaults to 200.
        concurrency (int): client threads, each with its own connection. Defaults to 4.
        model (str | None): model to call. Defaults to the first model served.

    Returns:
        dict: ``throughput_rps``, ``p50_ms``, ``p90_ms``, ``p99_ms``, ``mean_ms``, ``errors``,
        ``requests``, ``concurrency``, ``model``, ``version``, ``board``, ``server`` (the daemon's
        own statistics: mean queue and compute time, executions), ``board_metrics`` (gauges
        from /metrics: GPU/EMC utilization, memory budget and use, prefetch depth),
        ``exit_code``.

    Raises:
        DaemonError: the daemon did not start or serves no model.
        ClientMissing: tritonclient is not installed (the ``client`` extra).
    """
    if requests < 1 or concurrency < 1:
        raise DaemonError(f"requests ({requests}) and concurrency ({concurrency}) must be at least 1")
    httpclient = _import_httpclient()
    tmp = Path(tempfile.mkdtemp(prefix="cuvil-demo-"))
    proc = None
    try:
        store = _prepare_store(Path(bundle_dir_or_store), tmp)
        proc, url, log_path = start_daemon(store, "--telemetry", f"sim:{board}", "--board", board,
                                           log_path=tmp / "cuvil-edged.log")
        client = httpclient.InferenceServerClient(url)
        index = [m for m in client.get_model_repository_index() if m.get("state") == "READY"]
        if not index:
            raise DaemonError(f"cuvil-edged serves no model from {store}:\n"
                              + (tmp / "cuvil-edged.log").read_text(errors="replace")[-2000:])
        name = model or index[0]["name"]
        meta = client.get_model_metadata(name)
        version = meta["versions"][0]
        from cuvil_edge.bundle.layout import StoreLayout

        feed = _inputs_for(Path(StoreLayout.of(store).version_dir(name, version)), meta)
        client.close()

        latencies: list[float] = []
        errors: list[str] = []
        lock = threading.Lock()
        counter = iter(range(requests))

        def worker() -> None:
            c = httpclient.InferenceServerClient(url)
            inputs = []
            for k, arr in feed.items():
                i = httpclient.InferInput(k, list(arr.shape), meta_dtype[k])
                i.set_data_from_numpy(arr, binary_data=True)
                inputs.append(i)
            try:
                while True:
                    with lock:
                        if next(counter, None) is None:
                            return
                    t0 = time.perf_counter()
                    try:
                        c.infer(name, inputs)
                        dt = time.perf_counter() - t0
                        with lock:
                            latencies.append(dt)
                    except Exception as exc:  # counted and reported, the run goes on
                        with lock:
                            errors.append(str(exc))
            finally:
                c.close()

        meta_dtype = {i["name"]: i["datatype"] for i in meta["inputs"]}
        # Warm the connections and the model outside the measurement.
        warm = httpclient.InferenceServerClient(url)
        for _ in range(min(20, requests)):
            ins = []
            for k, arr in feed.items():
                i = httpclient.InferInput(k, list(arr.shape), meta_dtype[k])
                i.set_data_from_numpy(arr)
                ins.append(i)
            warm.infer(name, ins)
        warm.close()
        threads = [threading.Thread(target=worker) for _ in range(concurrency)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
        status, stats_body = _get(url, f"/v2/models/{name}/stats")
        import json

        stats = json.loads(stats_body)["model_stats"][0] if status == 200 else {}
        _, metrics_body = _get(url, "/metrics")
        board_metrics = _parse_metrics(metrics_body.decode(errors="replace"))
        proc.send_signal(signal.SIGTERM)
        try:
            exit_code = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            exit_code = proc.wait()
        lat = np.asarray(latencies) * 1000.0
        inf = stats.get("inference_stats", {})

        def mean_ms(key: str) -> float | None:
            d = inf.get(key) or {}
            return round(d["ns"] / d["count"] / 1e6, 4) if d.get("count") else None

        return {
            "model": name,
            "version": version,
            "board": board,
            "requests": requests,
            "concurrency": concurrency,
            "errors": len(errors),
            "error_examples": errors[:3],
            "throughput_rps": round(len(latencies) / wall, 2) if wall > 0 else 0.0,
            "p50_ms": round(float(np.percentile(lat, 50)), 3) if lat.size else None,
            "p90_ms": round(float(np.percentile(lat, 90)), 3) if lat.size else None,
            "p99_ms": round(float(np.percentile(lat, 99)), 3) if lat.size else None,
            "mean_ms": round(float(lat.mean()), 3) if lat.size else None,
            "server": {
                "executions": stats.get("execution_count"),
                "inferences": stats.get("inference_count"),
                "queue_ms_mean": mean_ms("queue"),
                "compute_infer_ms_mean": mean_ms("compute_infer"),
                "request_ms_mean": mean_ms("success"),
            },
            "board_metrics": board_metrics,
            "exit_code": exit_code,
        }
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


_KEEP = ("cuvil_board_gpu_utilization_percent", "cuvil_board_emc_utilization_percent",
         "cuvil_board_ram_used_bytes", "cuvil_memory_budget_bytes", "cuvil_memory_used_bytes",
         "cuvil_memory_pressure_level", "cuvil_prefetch_depth", "cuvil_board_power_milliwatts")


def _parse_metrics(text: str) -> dict[str, float]:
    """The board and scheduler series worth keeping in a report, ``{name{labels}: value}``."""
    from cuvil_edge._prometheus import flatten, parse_prometheus

    return flatten(parse_prometheus(text), _KEEP)
