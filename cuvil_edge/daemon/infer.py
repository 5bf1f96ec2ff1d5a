"""The inference core: what every front end does with a request, written once.

A request goes: the codec decodes its wire format -> :meth:`InferenceCore.admit_request` (memory
pressure, draining, the model) -> :func:`check_input_header` per input and
:func:`complete_inputs` on the whole -> :meth:`InferenceCore.enqueue` (:func:`batch_key`, a
:class:`~cuvil_edge.daemon.batcher.Pending` on the model's batcher, which runs, post-processes and
calls the codec's encoder in its worker; encoders use :func:`classify` for Triton's
classification extension) -> :meth:`InferenceCore.settle` (accounting) -> the codec writes the
answer.

HTTP (:mod:`cuvil_edge.daemon.kserve` over :mod:`cuvil_edge.daemon.http`) and gRPC
(:mod:`cuvil_edge.daemon.grpc_server`) are codecs over this module, as uvicorn's protocol
implementations are over its shared utilities: they turn their wire format into arrays, and the
core's :class:`Refusal`, :class:`BadRequest` and :class:`Outcome` into their own status codes. A
fix in admission, input checks, batch keys, top-k or accounting is made here, once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from cuvil_edge.daemon.batcher import Pending
from cuvil_edge.daemon.models import ModelInstance, ModelRegistry, ModelUnavailable
from cuvil_edge.daemon.pipeline import IMAGE_INPUT, top_k
from cuvil_edge.errors import DaemonError
from cuvil_edge.runtime.base import TensorSpec

__all__ = ["BadRequest", "InferenceCore", "MemoryRefused", "Outcome", "Refusal", "batch_key", "check_input_header",
           "classify", "complete_inputs", "serialize_bytes"]


class BadRequest(DaemonError):
    """A request the client must fix; ``status`` is the HTTP code (gRPC maps it)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class MemoryRefused(DaemonError):
    """A model's footprint does not fit the memory budget (HTTP 507, gRPC RESOURCE_EXHAUSTED).

    Not a broken bundle: the model may fit later (another unloads, the pressure eases), so it
    never counts as a model that cannot serve at start."""


class Refusal(DaemonError):
    """A request refused before it is decoded: HTTP 503 (gRPC: ``RESOURCE_EXHAUSTED`` for memory
    pressure, ``UNAVAILABLE`` otherwise), with the seconds after which a retry may succeed.

    Attributes:
        reason (str): ``pressure`` (the ladder rejects new requests), ``unloaded`` (the model was
            unloaded under memory pressure and comes back when it eases) or ``draining``.
        retry_after (int | None): seconds, None when a retry will not help (draining).
    """

    def __init__(self, message: str, reason: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after = retry_after
        self.status = 503


class Counters(Protocol):
    """What the core counts on the daemon's shared state (``server.ServerState``)."""

    rejected: int
    failed_unknown: int
    shutting_down: bool


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a request ended, for the codec to write: ``status`` is 200 with ``body`` (what the
    codec's encoder made), or the HTTP code and message of the failure (499: the client left)."""

    status: int
    message: str = ""
    body: Any = None

    @property
    def ok(self) -> bool:
        return self.status == 200


# ---------------------------------------------------------------------- input checks

def _shape_ok(spec_shape: tuple[int, ...], shape: list[int]) -> bool:
    if len(spec_shape) != len(shape):
        return False
    return all(s < 0 or s == d for s, d in zip(spec_shape, shape, strict=True))


def check_input_header(inst: ModelInstance, arrays: dict[str, np.ndarray], name: object, shape: list[int],
                       datatype: object) -> TensorSpec:
    """The checks every front end makes on one input's name, shape and datatype, before its data.

    HTTP (JSON) and gRPC (protobuf) carry the same three fields in different forms; both call this
    so a request is refused for the same reason with the same words over either. Returns the
    model's :class:`~cuvil_edge.runtime.base.TensorSpec` of the input.

    Raises:
        BadRequest: unknown or repeated input, negative dimension, wrong datatype or shape.
    """
    spec = inst.input_specs.get(name) if isinstance(name, str) else None
    if spec is None:
        raise BadRequest(f"unexpected inference input '{name}' for model '{inst.name}'; it takes "
                         f"{sorted(inst.input_specs)}")
    if spec.name in arrays:
        raise BadRequest(f"input '{name}' is given twice")
    if any(d < 0 for d in shape):
        raise BadRequest(f"input '{name}': shape must hold non-negative integers, got {shape}")
    if datatype != spec.datatype:
        raise BadRequest(f"inference input '{name}' data-type is '{datatype}', but model "
                         f"'{inst.name}' expects '{spec.datatype}'")
    if name == IMAGE_INPUT and inst.pipeline is not None and inst.pipeline.image_spec is spec:
        if len(shape) not in (3, 4) or shape[-1] != 3 or 0 in shape:
            raise BadRequest(f"input '{IMAGE_INPUT}' must be UINT8 [H, W, 3] or [N, H, W, 3] (HWC RGB), "
                             f"got shape {shape}")
    elif not _shape_ok(spec.shape, shape):
        raise BadRequest(f"unexpected shape for input '{name}' for model '{inst.name}'. Expected "
                         f"{list(spec.shape)}, got {shape}")
    return spec


def complete_inputs(inst: ModelInstance, arrays: dict[str, np.ndarray]) -> int:
    """Checks the decoded inputs as a whole and returns the batch size (1 for a model without batching).

    Required inputs are the model's, except the first when the daemon's ``image`` input replaces it
    (a single ``[H, W, 3]`` image gains its batch axis here).

    Raises:
        BadRequest: both the image and the tensor it replaces, a missing input, batch sizes that
            disagree, or a batch over the model's maximum.
    """
    model_inputs = [s.name for s in (inst.pipeline.model_inputs if inst.pipeline else [])]
    required = set(model_inputs)
    if IMAGE_INPUT in arrays and model_inputs and IMAGE_INPUT not in model_inputs:
        if model_inputs[0] in arrays:
            raise BadRequest(f"give either '{IMAGE_INPUT}' or '{model_inputs[0]}', not both")
        required.discard(model_inputs[0])
        if arrays[IMAGE_INPUT].ndim == 3:
            arrays[IMAGE_INPUT] = arrays[IMAGE_INPUT][None]
    missing = sorted(required - set(arrays))
    if missing:
        raise BadRequest(f"model '{inst.name}' expects input {missing[0]!r}"
                         + (f" (or '{IMAGE_INPUT}')" if inst.pipeline and inst.pipeline.image_spec
                            and missing[0] == model_inputs[0] else ""))
    if not inst.max_batch:
        return 1
    sizes = {a.shape[0] for a in arrays.values()}
    if len(sizes) != 1:
        raise BadRequest(f"inputs disagree on the batch size (first dimension): {sorted(sizes)}")
    n = sizes.pop()
    if n < 1 or n > inst.max_batch:
        raise BadRequest(f"inference request batch-size must be <= {inst.max_batch} for "
                         f"'{inst.name}', got {n}")
    return n


def batch_key(inst: ModelInstance, arrays: dict[str, np.ndarray]) -> Hashable:
    """Requests batch together only under the same key: images (resized to one size by the
    pipeline) share one; tensors share one when every non-batch dimension agrees; a model that
    does not batch (``max_batch`` 0: state or scalar inputs) runs each request alone anyway."""
    if IMAGE_INPUT in arrays and inst.pipeline is not None and inst.pipeline.image_spec is not None:
        return IMAGE_INPUT
    return tuple((k, a.shape[1:]) for k, a in arrays.items()) if inst.max_batch else None


# ---------------------------------------------------------------------- outputs

def classify(arr: np.ndarray, cls: int) -> tuple[list[int], list[bytes]]:
    """Triton's classification extension: the top ``cls`` entries of each row as ``"value:index"``
    strings, best first (ties by index), with the ``[rows, k]`` shape they travel in."""
    rows = arr.reshape(arr.shape[0] if arr.ndim > 1 else 1, -1)
    vals, idx = top_k(rows, cls)
    strings = [f"{v:f}:{i}".encode() for rv, ri in zip(vals.tolist(), idx.tolist(), strict=True)
               for v, i in zip(rv, ri, strict=True)]
    return [rows.shape[0], int(idx.shape[1])], strings


def serialize_bytes(values: list[bytes]) -> bytes:
    """BYTES tensor elements as KServe's binary form: each a 4-byte little-endian length, then it."""
    out = bytearray()
    for v in values:
        out += len(v).to_bytes(4, "little")
        out += v
    return bytes(out)


# ---------------------------------------------------------------------- the core

class InferenceCore:
    """Admission, submission and accounting for every front end.

    Args:
        registry (ModelRegistry): the served models.
        counters (Counters): the daemon's shared counters and draining flag.
        pressure (Callable[[], tuple[bool, float]] | None): ``(reject, retry_after_s)`` from the
            memory pressure ladder; None without a scheduler.
    """

    def __init__(self, registry: ModelRegistry, counters: Counters,
                 pressure: Callable[[], tuple[bool, float]] | None = None) -> None:
        self.registry = registry
        self.counters = counters
        self.pressure = pressure

    def lookup(self, name: str, version: str | None) -> ModelInstance:
        """The instance serving ``name`` (``version``).

        Raises:
            Refusal: the model was unloaded under memory pressure and comes back when it eases.
            UnknownModel: the model or version is not served.
        """
        try:
            return self.registry.get(name, version or None)
        except ModelUnavailable as exc:
            raise Refusal(str(exc), "unloaded", exc.retry_after) from None

    def admit_request(self, name: str, version: str | None) -> ModelInstance:
        """Whether an inference request may proceed, before its body is decoded; its model.

        Raises:
            Refusal: memory pressure, a model unloaded under pressure, or a draining daemon.
            UnknownModel: the model or version is not served (counted).
        """
        if self.pressure is not None:
            reject, retry = self.pressure()
            if reject:
                self.counters.rejected += 1
                entry = self.registry.entries.get(name)
                if entry is not None and entry.instance is not None:
                    entry.instance.stats.rejected += 1
                    entry.instance.stats.record_request(False, 0)
                secs = max(1, int(round(retry)))
                raise Refusal(f"memory pressure: the daemon is refusing new requests for now; retry in {secs} s",
                              "pressure", secs)
        if self.counters.shutting_down:
            raise Refusal("the daemon is shutting down", "draining")
        try:
            return self.lookup(name, version)
        except Refusal:
            self.counters.rejected += 1
            raise
        except DaemonError:
            self.counters.failed_unknown += 1
            raise

    @staticmethod
    def pin(inst: ModelInstance) -> None:
        """Keep ``inst`` from retiring while a request of it is decoded off the loop."""
        inst.inflight += 1

    @staticmethod
    def unpin(inst: ModelInstance) -> None:
        """The decode that :meth:`pin` covered is over."""
        inst.inflight -= 1

    @staticmethod
    def refused(inst: ModelInstance, received: float) -> None:
        """Count a request of ``inst`` refused after admission (bad input, failed decoding)."""
        inst.stats.record_request(False, int((time.perf_counter() - received) * 1e9))

    @staticmethod
    def enqueue(inst: ModelInstance, arrays: dict[str, np.ndarray], n: int, wanted: list[str] | None,
               deliver: Callable[[Pending], None], encode: Callable[[Pending], Any], ctx: Any,
               at_once: bool = False) -> Pending:
        """Queue a decoded, checked request on its model's batcher; ``deliver`` runs on the loop
        with the outcome, which the codec passes to :meth:`settle`. With ``at_once`` a model fast
        enough to run inline on an idle batcher runs before this returns, ``deliver`` included
        (for a codec that awaits the one answer, so nothing needs the loop's next iteration)."""
        p = Pending(arrays, n, batch_key(inst, arrays), wanted, deliver, encode, ctx)
        inst.submit(p, at_once)
        return p

    @staticmethod
    def settle(p: Pending, inst: ModelInstance, received: float, client_gone: bool = False) -> Outcome:
        """Account one delivered request (loop thread) and say how it ended."""
        inst.inflight -= 1
        elapsed = int((time.perf_counter() - received) * 1e9)
        if client_gone or p.cancelled:
            inst.stats.cancelled += 1
            inst.stats.record_request(False, elapsed)
            return Outcome(499, "the client cancelled the request")
        if p.error is not None:
            inst.stats.record_request(False, elapsed)
            return Outcome(*p.error)
        if p.body is None:
            inst.stats.record_request(False, elapsed)
            return Outcome(500, "the request was dropped without an answer")
        inst.stats.record_request(True, elapsed)
        return Outcome(200, "", p.body)
