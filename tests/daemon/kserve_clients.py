"""One face for the four ways stock tritonclient talks to a KServe v2 server.

``http`` (tritonclient.http), ``grpc`` (tritonclient.grpc, sync), ``grpc-aio``
(tritonclient.grpc.aio on a private event loop) and ``grpc-stream`` (inference over
``start_stream``/``async_stream_infer``; the other calls through the sync gRPC client). Each
adapter returns plain data (ints, lists, numpy arrays) so the conformance tests assert the same
things whatever the protocol; errors surface as tritonclient's ``InferenceServerException``.
"""

from __future__ import annotations

import asyncio
import queue
from typing import Any

import numpy as np
from tritonclient.utils import InferenceServerException

KINDS = ("http", "grpc", "grpc-aio", "grpc-stream")


class KServeClient:
    """A tritonclient of one ``kind`` with helpers returning plain data.

    Args:
        kind (str): one of :data:`KINDS`.
        http_url (str): ``host:port`` of the daemon's HTTP front end.
        grpc_url (str): ``host:port`` of its gRPC front end.
        headers (dict | None): sent with every call (a bearer token). Defaults to none.
    """

    def __init__(self, kind: str, http_url: str, grpc_url: str, headers: dict[str, str] | None = None) -> None:
        self.kind = kind
        self.headers = dict(headers or {})
        self._loop: asyncio.AbstractEventLoop | None = None
        if kind == "http":
            import tritonclient.http as mod
            self.mod = mod
            self.client = mod.InferenceServerClient(http_url)
        elif kind == "grpc-aio":
            import tritonclient.grpc as mod
            import tritonclient.grpc.aio as aio
            self.mod = mod
            self._loop = asyncio.new_event_loop()
            self.client = self._run(self._make_aio(aio, grpc_url))
        else:
            import tritonclient.grpc as mod
            self.mod = mod
            self.client = mod.InferenceServerClient(grpc_url)

    @staticmethod
    async def _make_aio(aio: Any, url: str) -> Any:
        return aio.InferenceServerClient(url)

    def _run(self, value: Any) -> Any:
        if self._loop is not None and asyncio.iscoroutine(value):
            return self._loop.run_until_complete(value)
        return value

    def close(self) -> None:
        if self._loop is not None:
            self._loop.run_until_complete(self.client.close())
            self._loop.close()
            self._loop = None
        else:
            self.client.close()

    def _h(self, headers: dict[str, str] | None) -> dict[str, str]:
        return self.headers if headers is None else headers

    @property
    def is_grpc(self) -> bool:
        return self.kind != "http"

    # ------------------------------------------------------------------ health and metadata

    def live(self) -> bool:
        return bool(self._run(self.client.is_server_live(headers=self.headers)))

    def ready(self) -> bool:
        return bool(self._run(self.client.is_server_ready(headers=self.headers)))

    def model_ready(self, name: str, version: str = "") -> bool:
        return bool(self._run(self.client.is_model_ready(name, version, headers=self.headers)))

    def server_metadata(self, headers: dict[str, str] | None = None) -> dict[str, Any]:
        m = self._run(self.client.get_server_metadata(headers=self._h(headers)))
        if not self.is_grpc:
            return m
        return {"name": m.name, "version": m.version, "extensions": list(m.extensions)}

    def model_metadata(self, name: str, version: str = "", headers: dict[str, str] | None = None) -> dict[str, Any]:
        m = self._run(self.client.get_model_metadata(name, version, headers=self._h(headers)))
        if not self.is_grpc:
            return m

        def tensors(ts: Any) -> list[dict[str, Any]]:
            return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in ts]

        return {"name": m.name, "versions": list(m.versions), "platform": m.platform,
                "inputs": tensors(m.inputs), "outputs": tensors(m.outputs)}

    def model_config(self, name: str) -> dict[str, Any]:
        """max_batch_size, inputs/outputs as (name, data_type, dims), batching and parameters."""
        c = self._run(self.client.get_model_config(name, headers=self.headers))
        if not self.is_grpc:
            return {"max_batch_size": c["max_batch_size"],
                    "input": [(i["name"], i["data_type"], i["dims"]) for i in c["input"]],
                    "output": [(o["name"], o["data_type"], o["dims"]) for o in c["output"]],
                    "dynamic_batching": "dynamic_batching" in c,
                    "parameters": {k: v["string_value"] for k, v in c.get("parameters", {}).items()}}
        from tritonclient.grpc import model_config_pb2 as mc

        c = c.config
        return {"max_batch_size": c.max_batch_size,
                "input": [(i.name, mc.DataType.Name(i.data_type), list(i.dims)) for i in c.input],
                "output": [(o.name, mc.DataType.Name(o.data_type), list(o.dims)) for o in c.output],
                "dynamic_batching": c.HasField("dynamic_batching"),
                "parameters": {k: v.string_value for k, v in c.parameters.items()}}

    def statistics(self, name: str = "") -> list[dict[str, Any]]:
        """Per version: name, version, success/fail counts, inference and execution counts."""
        s = self._run(self.client.get_inference_statistics(name, headers=self.headers))
        if not self.is_grpc:
            return [{"name": m["name"], "version": m["version"],
                     "success": m["inference_stats"]["success"]["count"],
                     "fail": m["inference_stats"]["fail"]["count"],
                     "inference_count": m["inference_count"], "execution_count": m["execution_count"],
                     "batch_sizes": [b["batch_size"] for b in m["batch_stats"]]}
                    for m in s["model_stats"]]
        return [{"name": m.name, "version": m.version, "success": m.inference_stats.success.count,
                 "fail": m.inference_stats.fail.count, "inference_count": m.inference_count,
                 "execution_count": m.execution_count, "batch_sizes": [b.batch_size for b in m.batch_stats]}
                for m in s.model_stats]

    # ------------------------------------------------------------------ repository

    def index(self) -> list[tuple[str, str]]:
        r = self._run(self.client.get_model_repository_index(headers=self.headers))
        if not self.is_grpc:
            return [(m["name"], m.get("state", "")) for m in r]
        return [(m.name, m.state) for m in r.models]

    def load(self, name: str) -> None:
        self._run(self.client.load_model(name, headers=self.headers))

    def unload(self, name: str) -> None:
        self._run(self.client.unload_model(name, headers=self.headers))

    # ------------------------------------------------------------------ shared memory

    def shm_register(self, name: str, key: str, byte_size: int, offset: int = 0) -> None:
        self._run(self.client.register_system_shared_memory(name, key, byte_size, offset, headers=self.headers))

    def shm_unregister(self, name: str = "") -> None:
        self._run(self.client.unregister_system_shared_memory(name, headers=self.headers))

    def shm_status(self) -> dict[str, tuple[str, int, int]]:
        """region name -> (key, offset, byte_size)."""
        s = self._run(self.client.get_system_shared_memory_status(headers=self.headers))
        if not self.is_grpc:
            return {r["name"]: (r["key"], int(r["offset"]), int(r["byte_size"])) for r in s}
        return {n: (r.key, r.offset, r.byte_size) for n, r in s.regions.items()}

    def cuda_shm_register(self) -> None:
        self._run(self.client.register_cuda_shared_memory("gpu0", b"\0" * 64, 0, 16, headers=self.headers))

    # ------------------------------------------------------------------ inference

    def make_input(self, name: str, x: np.ndarray | None = None, datatype: str = "FP32",
                   shape: list[int] | None = None, shm: tuple[str, int, int] | None = None) -> Any:
        inp = self.mod.InferInput(name, list(shape if shape is not None else x.shape), datatype)
        if shm is not None:
            inp.set_shared_memory(shm[0], shm[2], shm[1])
        else:
            inp.set_data_from_numpy(x)
        return inp

    def make_output(self, name: str, class_count: int = 0, shm: tuple[str, int, int] | None = None) -> Any:
        out = self.mod.InferRequestedOutput(name, class_count=class_count)
        if shm is not None:
            out.set_shared_memory(shm[0], shm[2], shm[1])
        return out

    def infer(self, model: str, inputs: list[Any], outputs: list[Any] | None = None, request_id: str = "",
              version: str = "", headers: dict[str, str] | None = None) -> Any:
        """The tritonclient result (``as_numpy``; ``response()`` gives id and version)."""
        headers = self._h(headers)
        if self.kind == "grpc-stream":
            return self._stream([(model, inputs, outputs, request_id, version)], headers)[0]
        return _Result(self._run(self.client.infer(model, inputs, model_version=version, outputs=outputs,
                                                   request_id=request_id, headers=headers)), self.is_grpc)

    def _stream(self, calls: list[tuple[Any, ...]], headers: dict[str, str]) -> list[Any]:
        answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: answers.put((result, error)), headers=headers)
        try:
            try:
                for model, inputs, outputs, rid, version in calls:
                    self.client.async_stream_infer(model, inputs, model_version=version, outputs=outputs,
                                                   request_id=rid)
            except InferenceServerException:
                # The server ended the stream (a refused call): its reason went to the callback.
                _result, error = answers.get(timeout=60)
                raise error or InferenceServerException("the stream ended without a reason") from None
            got = [answers.get(timeout=60) for _ in calls]
        finally:
            self.client.stop_stream()
        by_id: dict[str, Any] = {}
        for result, error in got:
            if error is not None:
                raise error
            by_id[result.get_response().id] = _Result(result, True)
        return [by_id[c[3]] for c in calls] if len(calls) > 1 else list(by_id.values())

    def stream_many(self, calls: list[tuple[Any, ...]]) -> list[Any]:
        """Several requests on one stream (grpc-stream only); results in call order by id."""
        return self._stream(calls, self.headers)


class _Result:
    """``as_numpy`` plus the id and version, whatever the protocol."""

    def __init__(self, result: Any, grpc: bool) -> None:
        self.result = result
        response = result.get_response()
        if grpc:
            self.id, self.model_version = response.id, response.model_version
            self.outputs = {o.name: dict(o.parameters) for o in response.outputs}
        else:
            self.id, self.model_version = response.get("id", ""), response["model_version"]
            self.outputs = {o["name"]: o.get("parameters", {}) for o in response["outputs"]}

    def as_numpy(self, name: str) -> np.ndarray:
        return self.result.as_numpy(name)


__all__ = ["KINDS", "InferenceServerException", "KServeClient"]
