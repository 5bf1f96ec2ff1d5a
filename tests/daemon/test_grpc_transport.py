"""The gRPC transport (grpc core's completion queue, driven from the event loop): what is its own."""

from __future__ import annotations

import threading
import types

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from cuvil_edge.daemon import grpc_cq
from cuvil_edge.errors import DaemonError


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rpartition(" ")[2])
    raise AssertionError(f"{name} missing")


def test_concurrent_calls_batch_together(daemon, digits_data):
    """Calls whose messages arrive in one burst run as one batch (each used to run alone: mean
    batch 1.0 at 8 clients), and every answer is its own request's."""
    x = np.ascontiguousarray(digits_data[:8], np.float32)
    errors: list[str] = []
    go = threading.Barrier(8)

    def client(i: int) -> None:
        c = daemon.grpc_client()
        inp = grpcclient.InferInput("input", [1, 1, 8, 8], "FP32")
        inp.set_data_from_numpy(x[i:i + 1])
        mine = c.infer("digits", [inp]).as_numpy("logits")
        go.wait()
        for _ in range(150):
            got = c.infer("digits", [inp]).as_numpy("logits")
            if not np.array_equal(got, mine):
                errors.append(f"client {i}: another request's answer")
                return

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    text = daemon.metrics()
    labels = '{model="digits",version="1.0.0"}'
    requests = _metric(text, f"nv_inference_count{labels}")
    batches = _metric(text, f"nv_inference_exec_count{labels}")
    assert requests >= 8 * 151
    assert batches < 0.9 * requests, f"{requests:.0f} requests ran in {batches:.0f} batches"


def test_a_grpcio_without_the_core_parts_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(grpc_cq, "_core", lambda: types.SimpleNamespace(Server=object))
    with pytest.raises(DaemonError, match=r"grpcio .* lacks CompletionQueue.*--grpc 0"):
        grpc_cq.check_core()
