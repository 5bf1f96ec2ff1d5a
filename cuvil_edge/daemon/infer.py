"""The inference core: what every front end does with a request, written once.

decode (the codec's) -> :func:`admit` -> :func:`check_input_header` / :func:`complete_inputs`
-> :func:`submit` (batch key, :class:`~cuvil_edge.daemon.batcher.Pending`) -> the model's batcher
runs and post-processes -> the codec's encoder (with :func:`top_k` for Triton's classification
extension) -> :func:`settle` (accounting) -> the codec writes the answer.

HTTP (:mod:`cuvil_edge.daemon.kserve` over :mod:`cuvil_edge.daemon.http`) and gRPC
(:mod:`cuvil_edge.daemon.grpc_server`) are codecs over these functions, as uvicorn's protocol
implementations are over its shared utilities: they turn their wire format into arrays and the
core's :class:`Refusal` / :class:`BadRequest` into their own status codes. A fix in admission,
input checks, batch keys, top-k or accounting is made here, once.
"""

from __future__ import annotations

from cuvil_edge.errors import DaemonError

__all__ = ["BadRequest", "MemoryRefused"]


class BadRequest(DaemonError):
    """A request the client must fix; ``status`` is the HTTP code (gRPC maps it)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class MemoryRefused(DaemonError):
    """A model's footprint does not fit the memory budget (HTTP 507, gRPC RESOURCE_EXHAUSTED).

    Not a broken bundle: the model may fit later (another unloads, the pressure eases), so it
    never counts as a model that cannot serve at start."""
