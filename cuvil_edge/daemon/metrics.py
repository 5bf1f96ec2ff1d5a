"""Per-model counters, the statistics extension, and ``/metrics`` in Prometheus text format.

Counter names follow Triton's (``nv_inference_request_success`` ...; durations are cumulative
microseconds) so existing dashboards work; board and scheduler figures are gauges named
``cuvil_*``. :class:`ModelStats` is updated from two threads: request outcomes on the event
loop, batch execution figures in the batcher's worker under ``lock``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["ModelStats", "render_prometheus"]


class _Duration:
    __slots__ = ("count", "ns")

    def __init__(self) -> None:
        self.count = 0
        self.ns = 0

    def add(self, ns: int, n: int = 1) -> None:
        self.count += n
        self.ns += ns

    def to_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


class ModelStats:
    """Counters of one model version (KServe statistics extension + Triton metrics)."""

    def __init__(self, name: str, version: str) -> None:
        self.name = name
        self.version = version
        self.lock = threading.Lock()
        self.success = _Duration()
        self.fail = _Duration()
        self.queue = _Duration()
        self.compute_input = _Duration()
        self.compute_infer = _Duration()
        self.compute_output = _Duration()
        self.inference_count = 0  # inferences (batch elements) executed
        self.execution_count = 0  # batches executed
        self.last_inference_ms = 0
        self.rejected = 0  # 503 by the pressure ladder
        self.cancelled = 0  # client went away
        self.batch: dict[int, list[_Duration]] = {}
        self.recent_queue_ns: deque[int] = deque(maxlen=512)
        self.recent_request_ns: deque[int] = deque(maxlen=1024)  # answered requests, for p50/p99

    def queue_p95_ms(self) -> float | None:
        """p95 of the last few hundred queue delays, ms (None before any)."""
        recent = sorted(self.recent_queue_ns)
        if not recent:
            return None
        return recent[min(len(recent) - 1, int(0.95 * len(recent)))] / 1e6

    def latency_ms(self, q: float) -> float | None:
        """The ``q``-th percentile of the last thousand request durations, ms (None before any)."""
        recent = sorted(self.recent_request_ns)
        if not recent:
            return None
        return recent[min(len(recent) - 1, int(q / 100.0 * len(recent)))] / 1e6

    def record_batch(self, size: int, queue_ns: Iterable[int], input_ns: int, infer_ns: int,
                     output_ns: int, requests: int) -> None:
        """One executed batch of ``size`` elements made of ``requests`` requests."""
        with self.lock:
            for q in queue_ns:
                self.queue.add(q)
                self.recent_queue_ns.append(q)
            self.compute_input.add(input_ns, requests)
            self.compute_infer.add(infer_ns, requests)
            self.compute_output.add(output_ns, requests)
            self.inference_count += size
            self.execution_count += 1
            self.last_inference_ms = int(time.time() * 1000)
            b = self.batch.get(size)
            if b is None:
                b = self.batch[size] = [_Duration(), _Duration(), _Duration()]
            b[0].add(input_ns)
            b[1].add(infer_ns)
            b[2].add(output_ns)

    def record_request(self, ok: bool, ns: int) -> None:
        """One request answered (on the event loop)."""
        self.recent_request_ns.append(ns)
        if ok:
            self.success.add(ns)
        else:
            self.fail.add(ns)

    def to_dict(self) -> dict[str, Any]:
        """The statistics-extension entry (``model_stats`` item) for this version."""
        with self.lock:
            return {
                "name": self.name,
                "version": self.version,
                "last_inference": self.last_inference_ms,
                "inference_count": self.inference_count,
                "execution_count": self.execution_count,
                "inference_stats": {
                    "success": self.success.to_dict(),
                    "fail": self.fail.to_dict(),
                    "queue": self.queue.to_dict(),
                    "compute_input": self.compute_input.to_dict(),
                    "compute_infer": self.compute_infer.to_dict(),
                    "compute_output": self.compute_output.to_dict(),
                    "cache_hit": {"count": 0, "ns": 0},
                    "cache_miss": {"count": 0, "ns": 0},
                },
                "batch_stats": [
                    {"batch_size": size, "compute_input": d[0].to_dict(),
                     "compute_infer": d[1].to_dict(), "compute_output": d[2].to_dict()}
                    for size, d in sorted(self.batch.items())
                ],
            }


_MODEL_METRICS = (
    ("nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes",
     lambda s: s.success.count),
    ("nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes",
     lambda s: s.fail.count),
    ("nv_inference_count", "counter", "Number of inferences performed (batch elements)",
     lambda s: s.inference_count),
    ("nv_inference_exec_count", "counter", "Number of model executions performed (batches)",
     lambda s: s.execution_count),
    ("nv_inference_request_duration_us", "counter", "Cumulative inference request duration in microseconds",
     lambda s: (s.success.ns + s.fail.ns) // 1000),
    ("nv_inference_queue_duration_us", "counter", "Cumulative inference queuing duration in microseconds",
     lambda s: s.queue.ns // 1000),
    ("nv_inference_compute_input_duration_us", "counter",
     "Cumulative compute input (pre-processing, batching) duration in microseconds",
     lambda s: s.compute_input.ns // 1000),
    ("nv_inference_compute_infer_duration_us", "counter",
     "Cumulative compute inference duration in microseconds", lambda s: s.compute_infer.ns // 1000),
    ("nv_inference_compute_output_duration_us", "counter",
     "Cumulative compute output (post-processing, split) duration in microseconds",
     lambda s: s.compute_output.ns // 1000),
    ("cuvil_inference_rejected_total", "counter", "Requests refused with 503 by the memory pressure ladder",
     lambda s: s.rejected),
    ("cuvil_inference_cancelled_total", "counter", "Requests whose client went away before the answer",
     lambda s: s.cancelled),
)


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(v: float | int) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    return repr(float(v))


def render_prometheus(stats: Iterable[ModelStats],
                      gauges: Mapping[str, tuple[str, list[tuple[dict[str, str], float]]]] | None = None,
                      counters: Mapping[str, tuple[str, list[tuple[dict[str, str], float]]]] | None = None,
                      ) -> bytes:
    """Prometheus text exposition (format 0.0.4).

    Args:
        stats (Iterable[ModelStats]): one per loaded model version.
        gauges (Mapping | None): metric name -> (help, [(labels, value), ...]). Defaults to none.
        counters (Mapping | None): same, typed as counters. Defaults to none.
    """
    stats = list(stats)
    out: list[str] = []
    for name, kind, help_text, get in _MODEL_METRICS:
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")
        for s in stats:
            out.append(f'{name}{{model="{_esc(s.name)}",version="{_esc(s.version)}"}} {get(s)}\n')
    for kind, table in (("gauge", gauges or {}), ("counter", counters or {})):
        for name, (help_text, samples) in table.items():
            if not samples:
                continue
            out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")
            for labels, value in samples:
                if value is None:
                    continue
                lab = ",".join(f'{k}="{_esc(str(v))}"' for k, v in labels.items())
                out.append(f"{name}{{{lab}}} {_num(value)}\n" if lab else f"{name} {_num(value)}\n")
    return "".join(out).encode()
