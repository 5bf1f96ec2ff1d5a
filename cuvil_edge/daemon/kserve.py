"""KServe v2 / Open Inference Protocol over HTTP, as Triton speaks it.

Endpoints (kserve ``docs/predict-api/v2/required_api.md`` and Triton's extensions)::

    GET  /v2/health/live | /v2/health/ready
    GET  /v2                                         server metadata
    GET  /v2/models/{m}[/versions/{v}]               model metadata
    GET  /v2/models/{m}[/versions/{v}]/ready
    GET  /v2/models/{m}[/versions/{v}]/config        Triton model configuration (JSON)
    POST /v2/models/{m}[/versions/{v}]/infer         JSON and binary tensors
    GET  /v2/models/{m}[/versions/{v}]/stats | /v2/models/stats     statistics extension
    POST /v2/repository/index | /v2/repository/models/{m}/load | .../unload
    GET  /metrics                                    Prometheus text

Binary tensor extension (Triton ``docs/protocol/extension_binary_data.md``): with an
``Inference-Header-Content-Length: N`` header the first N body bytes are the JSON header and the
rest is the inputs' raw bytes in input order, each input saying ``parameters.binary_data_size``.
Outputs come back binary when ``parameters.binary_data_output`` is true or an output asks for
``parameters.binary_data``; the answer then carries the same header. Errors are
``{"error": "..."}``: 400 for a bad request or unknown model (Triton's wording), 401 without the
bearer token, 413 for a body over the limit, 503 with ``Retry-After`` while the memory pressure
ladder rejects or the server drains, 507 when a model does not fit the memory budget.
"""

from __future__ import annotations

import asyncio
import json
import logging
import zlib
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import numpy as np

from cuvil_edge import __version__
from cuvil_edge.bundle.names import check_component
from cuvil_edge.daemon.batcher import Pending
from cuvil_edge.daemon.http import Request, json_error
from cuvil_edge.daemon.infer import (
    BadRequest,
    InferenceCore,
    MemoryRefused,
    Refusal,
    check_input_header,
    classify,
    complete_inputs,
    serialize_bytes,
)
from cuvil_edge.daemon.limits import (
    ANSWER_WINDOW,
    ANSWERS_FULL,
    JsonRefused,
    Limits,
    answer_bytes,
    bearer_ok,
    finite_json_list,
    loads_limited,
)
from cuvil_edge.daemon.models import ModelInstance, ModelRegistry, UnknownModel
from cuvil_edge.daemon.shm import OutputTarget, SharedMemoryError, SharedMemoryRegistry, shm_params, shm_route
from cuvil_edge.daemon.state import ServerState
from cuvil_edge.errors import BundleError, CuvilEdgeError
from cuvil_edge.runtime.base import datatype_of

__all__ = ["EXTENSIONS", "App", "decode_infer", "model_config_doc", "model_metadata_doc"]

log = logging.getLogger("cuvil_edge.daemon.kserve")

EXTENSIONS = ["classification", "binary_tensor_data", "model_repository", "statistics",
              "model_configuration", "system_shared_memory"]
_OCTET = b"application/octet-stream"
_JSON = b"application/json"
_TEXT = b"text/plain; version=0.0.4; charset=utf-8"
_EMPTY_OK = b"{}"
_MAX_NAME = 128  # the bundle contract's longest name (cuvil_edge.bundle.names)


_JSON_BYTES_PER_VALUE = 40  # "-1.2345678901234567e-308, " and then some


def _json_bound(inst: ModelInstance) -> int | None:
    """Largest plausible JSON request for ``inst``: every input at the largest batch, 40 bytes a
    value, plus 64 KiB; None when an input has free dimensions (an image of any size)."""
    total = 0
    for spec in inst.input_specs.values():
        dims = list(spec.shape)
        if inst.max_batch and dims:
            dims[0] = inst.max_batch
        if any(d < 0 for d in dims):
            return None
        count = 1
        for d in dims:
            count *= d
        total += count
    return total * _JSON_BYTES_PER_VALUE + (64 << 10)


def decode_infer(req_body: bytes | bytearray, header_len: bytes | None, inst: ModelInstance,
                 shm: SharedMemoryRegistry | None = None, limits: Limits | None = None,
                 ) -> tuple[dict[str, Any], dict[str, np.ndarray], int,
                            list[tuple[str, bool, int, OutputTarget | None]] | None, bool]:
    """Parse and check an infer request against the model.

    Returns:
        (header dict, input arrays, batch size, requested outputs [(name, binary, class_count,
        shared-memory target or None)] or None for all, binary_data_output flag).

    Raises:
        BadRequest: with the message for the client.
    """
    try:
        return _decode_infer(req_body, header_len, inst, shm, limits or _DEFAULT_LIMITS)
    except SharedMemoryError as exc:
        raise BadRequest(str(exc), exc.status) from None


def _decode_infer(req_body: bytes | bytearray, header_len: bytes | None, inst: ModelInstance,
                  shm: SharedMemoryRegistry | None, limits: Limits,
                  ) -> tuple[dict[str, Any], dict[str, np.ndarray], int,
                             list[tuple[str, bool, int, OutputTarget | None]] | None, bool]:
    body = req_body
    binary: memoryview | None = None
    if header_len is not None:
        try:
            hl = int(header_len)
        except ValueError:
            raise BadRequest(f"Inference-Header-Content-Length {header_len!r} is not an integer") from None
        if hl < 0 or hl > len(body):
            raise BadRequest(f"truncated request: Inference-Header-Content-Length is {hl} but the body "
                             f"has only {len(body)} bytes")
        header_bytes = body[:hl]
        binary = memoryview(body)[hl:]
    else:
        header_bytes = body
    bound = _json_bound(inst)
    if bound is not None and len(header_bytes) > bound:
        raise BadRequest(f"the JSON part of the request has {len(header_bytes)} bytes, more than model "
                         f"'{inst.name}' can take at its largest batch ({bound} bytes)", 413)
    try:
        doc = loads_limited(header_bytes, limits, "inference request header")
    except JsonRefused as exc:
        raise BadRequest(str(exc), exc.status) from None
    if not isinstance(doc, dict):
        raise BadRequest("the inference request must be a JSON object")
    items = doc.get("inputs")
    if not isinstance(items, list) or not items:
        raise BadRequest("the inference request needs a non-empty 'inputs' list")
    specs = inst.input_specs
    arrays: dict[str, np.ndarray] = {}
    offset = 0
    nbin = len(binary) if binary is not None else 0
    for item in items:
        if not isinstance(item, dict):
            raise BadRequest("each entry of 'inputs' must be an object with name, shape, datatype")
        name = item.get("name")
        shape = item.get("shape")
        if (not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool)
                                                   and d >= 0 for d in shape)):
            if isinstance(name, str) and name in specs and name not in arrays:
                raise BadRequest(f"input '{name}': 'shape' must be a list of non-negative integers, got {shape!r}")
            shape = []  # an unknown name is the error to report
        datatype = item.get("datatype")
        spec = check_input_header(inst, arrays, name, shape, datatype)
        count = 1
        for d in shape:
            count *= d
        dtype = spec.dtype
        params = item.get("parameters") or {}
        if not isinstance(params, dict):
            raise BadRequest(f"input '{name}': 'parameters' must be an object")
        bsize = params.get("binary_data_size")
        region = shm_params(params, f"input '{name}'")
        if region is not None:
            if shm is None:
                raise BadRequest("system shared memory is not enabled on this daemon")
            arr = shm.input_array(region[0], region[1], region[2], dtype, shape, f"input '{name}'")
        elif bsize is not None:
            if binary is None:
                raise BadRequest(f"input '{name}' has binary_data_size but the request has no "
                                 "Inference-Header-Content-Length header")
            expected = count * dtype.itemsize
            if not isinstance(bsize, int) or bsize != expected:
                raise BadRequest(f"input '{name}': binary_data_size {bsize} does not match shape {shape} of "
                                 f"{datatype} ({expected} bytes)")
            if offset + bsize > nbin:
                raise BadRequest(f"truncated binary data: input '{name}' needs {bsize} bytes at offset "
                                 f"{offset} but only {nbin - offset} remain")
            arr = np.frombuffer(binary, dtype, count, offset).reshape(shape)
            if (offset + len(header_bytes)) % dtype.itemsize:
                arr = arr.copy()  # unaligned in the body: give the runtime an aligned array
            offset += bsize
        else:
            data = item.get("data")
            if data is None:
                raise BadRequest(f"input '{name}' has neither 'data' nor parameters.binary_data_size")
            try:
                arr = np.asarray(data, dtype=dtype)
            except (ValueError, TypeError, OverflowError) as exc:
                raise BadRequest(f"input '{name}': 'data' is not a list of {datatype} values: {exc}") from None
            if arr.size != count:
                raise BadRequest(f"input '{name}': {arr.size} elements given for shape {shape} "
                                 f"({count} expected)")
            arr = arr.reshape(shape)
        arrays[spec.name] = arr
    if binary is not None and offset != nbin:
        raise BadRequest(f"the binary part of the body has {nbin - offset} bytes that no input claims "
                         "(check binary_data_size)")
    n = complete_inputs(inst, arrays)
    # Outputs.
    top_params = doc.get("parameters") or {}
    if not isinstance(top_params, dict):
        raise BadRequest("'parameters' must be an object")
    binary_out = bool(top_params.get("binary_data_output", False))
    outs_doc = doc.get("outputs")
    outputs: list[tuple[str, bool, int, OutputTarget | None]] | None = None
    if outs_doc:
        if not isinstance(outs_doc, list):
            raise BadRequest("'outputs' must be a list")
        if len(outs_doc) > len(inst.output_specs):
            raise BadRequest(f"'outputs' names {len(outs_doc)} outputs; model '{inst.name}' has "
                             f"{len(inst.output_specs)}")
        outputs = []
        for o in outs_doc:
            oname = o.get("name") if isinstance(o, dict) else None
            if not isinstance(oname, str) or oname not in inst.output_specs:
                raise BadRequest(f"unexpected inference output '{str(oname)[:100]}' for model '{inst.name}'; it has "
                                 f"{sorted(inst.output_specs)}")
            op = o.get("parameters") or {}
            if not isinstance(op, dict):
                raise BadRequest(f"output '{oname}': 'parameters' must be an object")
            cls = op.get("classification", 0)
            if not isinstance(cls, int) or isinstance(cls, bool) or cls < 0:
                raise BadRequest(f"output '{oname}': classification must be a non-negative integer")
            region = shm_params(op, f"output '{oname}'") if isinstance(op, dict) else None
            target = None
            if region is not None:
                if shm is None:
                    raise BadRequest("system shared memory is not enabled on this daemon")
                target = shm.output_target(region[0], region[1], region[2], f"output '{oname}'")
            outputs.append((oname, bool(op.get("binary_data", binary_out)), cls, target))
    return doc, arrays, n, outputs, binary_out


def model_metadata_doc(inst: ModelInstance) -> dict[str, Any]:
    """The KServe model metadata of ``inst`` (HTTP JSON; gRPC's ModelMetadataResponse fields)."""
    return {
        "name": inst.name,
        "versions": [inst.version],
        "platform": "tensorrt_plan" if inst.engine.backend == "tensorrt" else "onnxruntime_onnx",
        "inputs": [{"name": s.name, "datatype": s.datatype, "shape": list(s.shape)}
                   for s in inst.input_specs.values()],
        "outputs": [{"name": s.name, "datatype": s.datatype, "shape": list(s.shape)}
                    for s in inst.output_specs.values()],
    }


def model_config_doc(inst: ModelInstance) -> dict[str, Any]:
    """Triton's model configuration of ``inst`` (HTTP JSON; gRPC's ModelConfig fields)."""
    mb = inst.max_batch

    def tensor(s: Any, optional: bool = False) -> dict[str, Any]:
        dims = list(s.shape[1:] if mb else s.shape)
        d = {"name": s.name, "data_type": "TYPE_" + s.datatype, "dims": dims}
        if optional:
            d["optional"] = True
        return d

    pipe = inst.pipeline
    image = pipe.image_spec if pipe else None
    cfg: dict[str, Any] = {
        "name": inst.name,
        # What really runs: a stand-in engine is ONNX Runtime underneath and says so.
        "platform": "tensorrt_plan" if inst.engine.backend == "tensorrt" else "onnxruntime_onnx",
        "backend": inst.engine.backend,
        "precision": inst.engine.precision,
        "engine_key": inst.engine.engine_key,
        "engine": inst.engine.to_dict(),
        "version_policy": {"specific": {"versions": [inst.version]}},
        "max_batch_size": mb,
        "input": [tensor(s, optional=(image is not None and i == 0)) for i, s in
                  enumerate(pipe.model_inputs if pipe else [])] + ([tensor(image, True)] if image else []),
        "output": [tensor(s) for s in inst.output_specs.values()],
        "instance_group": [{"count": inst.batcher.max_depth if inst.batcher else 1,
                            "kind": "KIND_GPU" if inst.engine.backend == "tensorrt" else "KIND_CPU"}],
        # Relative to the store: the device's file system layout is nobody's business.
        "parameters": {"cuvil.bundle": {"string_value": f"bundles/{inst.name}/{inst.version}"},
                       "cuvil.precision": {"string_value": inst.spec.precision},
                       # gRPC's ModelConfig has no field for these: parameters carry them there.
                       "cuvil.backend": {"string_value": inst.engine.backend},
                       "cuvil.engine_key": {"string_value": inst.engine.engine_key or ""},
                       "cuvil.engine_reason": {"string_value": inst.engine.reason}},
    }
    if mb and inst.batcher is not None:
        cfg["dynamic_batching"] = {"preferred_batch_size": inst.batcher.preferred,
                                   "max_queue_delay_microseconds": inst.batcher.max_delay_ns // 1000}
        cfg["parameters"]["cuvil.batch_cap"] = {"string_value": str(inst.batcher.cap)}
        if inst.batch_profile_us:
            cfg["parameters"]["cuvil.batch_profile_us_per_sample"] = {
                "string_value": json.dumps(inst.batch_profile_us)}
    return cfg


def _to_shared_memory(entry: dict[str, Any], blobs: list[bytes], target: OutputTarget, value: Any) -> None:
    """Move an encoded output into its shared-memory region: no data in the answer, only where it went."""
    params = entry.pop("parameters", None) or {}
    if "binary_data_size" in params:
        blobs.pop()
    entry.pop("data", None)
    data = serialize_bytes(value) if isinstance(value, list) else value
    size = SharedMemoryRegistry.write(target, data, f"output '{entry['name']}'")
    entry["parameters"] = {"shared_memory_region": target.region.name, "shared_memory_byte_size": size}
    if target.offset:
        entry["parameters"]["shared_memory_offset"] = target.offset


_DEFAULT_LIMITS = Limits()


class App:
    """Routes requests; answers through ``request.respond``.

    Args:
        registry (ModelRegistry): the served models.
        state (ServerState): the daemon's shared state (ready, shutting_down, counters).
        token (str | None): bearer token required everywhere but ``/v2/health/*``.
        metrics (Callable[[], bytes]): renders ``/metrics``.
        pressure (Callable[[], tuple[bool, float]] | None): ``(reject, retry_after_s)`` from the
            memory pressure ladder; None when there is no scheduler.
        max_body (int): request body limit (also caps a decompressed body).
        limits (Limits | None): JSON size and depth limits. Defaults to :class:`Limits` ().
    """

    def __init__(self, registry: ModelRegistry, state: ServerState, token: str | None,
                 metrics: Callable[[], bytes], pressure: Callable[[], tuple[bool, float]] | None = None,
                 max_body: int = 64 << 20, shm: SharedMemoryRegistry | None = None,
                 limits: Limits | None = None) -> None:
        self.registry = registry
        self.shm = shm
        self.state = state
        self.token = token.encode() if token else None
        self.limits = limits or Limits(max_body=max_body)
        self.metrics = metrics
        self.pressure = pressure
        self.core = InferenceCore(registry, state, pressure)
        self.max_body = max_body
        self._tasks: set[asyncio.Task[None]] = set()
        self._server_meta = json.dumps({"name": "cuvil-edged", "version": __version__,
                                        "extensions": EXTENSIONS}).encode()

    # ------------------------------------------------------------------ routing

    def handle(self, req: Request) -> None:
        """Serve one request (the HttpProtocol's ``handle``)."""
        path = req.path
        # HttpProtocol already refused a wrong token on the headers; this guards other callers.
        if self.token is not None and not path.startswith("/v2/health/"):
            if not bearer_ok(req.headers.get(b"authorization"), self.token):
                req.error(401, "missing or wrong bearer token: send 'Authorization: Bearer <token>'",
                          [(b"www-authenticate", b'Bearer realm="cuvil-edged"')])
                return
        parts = path.split("/")
        n = len(parts)
        method = req.method
        if n >= 4 and parts[1] == "v2" and parts[2] == "models":
            if n == 4 and parts[3] == "stats":
                if self._get_only(req):
                    self._stats(req, None, None)
                return
            name = unquote(parts[3])
            rest = parts[4:]
            version = None
            if len(rest) >= 2 and rest[0] == "versions":
                version = unquote(rest[1])
                rest = rest[2:]
            action = rest[0] if rest else ""
            if len(rest) > 1 or len(name) > _MAX_NAME:
                req.error(404, "no such endpoint" if len(rest) > 1 else
                          f"model name of {len(name)} characters is longer than {_MAX_NAME}")
            elif action == "infer":
                if method != b"POST":
                    req.error(405, "use POST for infer")
                else:
                    self._infer(req, name, version)
            elif action == "":
                if self._get_only(req):
                    self._model_metadata(req, name, version)
            elif action == "ready":
                if self._get_only(req):
                    self._model_ready(req, name, version)
            elif action == "config":
                if self._get_only(req):
                    self._model_config(req, name, version)
            elif action == "stats":
                if self._get_only(req):
                    self._stats(req, name, version)
            else:
                req.error(404, f"no such endpoint: {path}")
            return
        if path == "/v2/health/live":
            if self._get_only(req):
                req.respond(200 if not self.state.stopped else 503, b"")
        elif path == "/v2/health/ready":
            if self._get_only(req):
                ok = self.state.ready and not self.state.shutting_down
                req.respond(200 if ok else 503, b"" if ok else json_error("server is not ready"))
        elif path in ("/v2", "/v2/"):
            if self._get_only(req):
                req.respond(200, self._server_meta)
        elif path == "/metrics":
            if self._get_only(req):
                req.respond(200, self.metrics(), _TEXT)
        elif n >= 4 and parts[1] == "v2" and parts[2] in ("systemsharedmemory", "cudasharedmemory"):
            shm_route(self.shm, req, parts)
        elif n >= 4 and parts[1] == "v2" and parts[2] == "repository":
            if method != b"POST":
                req.error(405, "use POST for repository requests")
            elif n == 4 and parts[3] == "index":
                self._index(req)
            elif n == 6 and parts[3] == "models" and parts[5] in ("load", "unload"):
                self._repo(req, unquote(parts[4]), parts[5])
            else:
                req.error(404, f"no such endpoint: {path}")
        else:
            req.error(404, f"no such endpoint: {path}")

    @staticmethod
    def _get_only(req: Request) -> bool:
        """GET (or HEAD: the same headers, no body) only; 405 with ``Allow`` otherwise."""
        if req.method not in (b"GET", b"HEAD"):
            req.error(405, f"use GET for {req.path[:200]}", [(b"allow", b"GET, HEAD")])
            return False
        return True

    def _lookup(self, req: Request, name: str, version: str | None) -> ModelInstance | None:
        try:
            return self.core.lookup(name, version)
        except Refusal as exc:
            self._refuse(req, exc)
        except UnknownModel as exc:
            req.error(400, str(exc))
        return None

    @staticmethod
    def _refuse(req: Request, exc: Refusal) -> None:
        headers = [(b"retry-after", str(exc.retry_after).encode())] if exc.retry_after is not None else None
        req.error(exc.status, str(exc), headers)

    # ------------------------------------------------------------------ metadata

    def _model_metadata(self, req: Request, name: str, version: str | None) -> None:
        inst = self._lookup(req, name, version)
        if inst is not None:
            req.respond(200, json.dumps(model_metadata_doc(inst)).encode())

    def _model_ready(self, req: Request, name: str, version: str | None) -> None:
        inst = self._lookup(req, name, version)
        if inst is not None:
            req.respond(200, b"")

    def _model_config(self, req: Request, name: str, version: str | None) -> None:
        inst = self._lookup(req, name, version)
        if inst is not None:
            req.respond(200, json.dumps(model_config_doc(inst)).encode())

    def _stats(self, req: Request, name: str | None, version: str | None) -> None:
        if name is None:
            stats = [i.stats.to_dict() for i in self.registry.instances()]
        else:
            inst = self._lookup(req, name, version)
            if inst is None:
                return
            stats = [inst.stats.to_dict()]
        req.respond(200, json.dumps({"model_stats": stats}).encode())

    # ------------------------------------------------------------------ repository

    def _index(self, req: Request) -> None:
        ready_only = False
        if req.body:
            try:
                doc = loads_limited(req.body, self.limits, "repository index request")
            except JsonRefused as exc:
                req.error(exc.status, str(exc))
                return
            ready_only = bool(doc.get("ready", False)) if isinstance(doc, dict) else False
        items = self.registry.index()
        if ready_only:
            items = [i for i in items if i["state"] == "READY"]
        req.respond(200, json.dumps(items).encode())

    def _repo(self, req: Request, name: str, action: str) -> None:
        version = None
        try:
            check_component("name", name)
        except BundleError as exc:
            req.error(400, f"failed to {action}: {exc}")
            return
        if req.body:
            try:
                doc = loads_limited(req.body, self.limits, f"{action} request")
            except JsonRefused as exc:
                req.error(exc.status, str(exc))
                return
            params = doc.get("parameters") if isinstance(doc, dict) else None
            if isinstance(params, dict) and isinstance(params.get("version"), str):
                version = params["version"]
        coro = self._load(req, name, version) if action == "load" else self._unload(req, name)
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)  # keep a hard reference until done
        task.add_done_callback(self._tasks.discard)

    async def _load(self, req: Request, name: str, version: str | None) -> None:
        try:
            await self.registry.load(name, version)
        except MemoryRefused as exc:
            req.error(507, f"failed to load '{name}': {exc}")
        except CuvilEdgeError as exc:
            req.error(400, f"failed to load '{name}': {self._public(exc)}")
        except Exception as exc:
            log.exception("loading %s failed", name)
            req.error(500, f"failed to load '{name}': internal error ({type(exc).__name__}); see the daemon's log")
        else:
            req.respond(200, b"")

    def _public(self, exc: Exception) -> str:
        """``exc``'s message without the store's absolute path (clients see store-relative paths)."""
        text = str(exc)
        root = str(self.registry.store.root).rstrip("/")
        return text.replace(root + "/", "").replace(root, "<store>") if root else text

    async def _unload(self, req: Request, name: str) -> None:
        try:
            await self.registry.unload(name)
        except CuvilEdgeError as exc:
            req.error(400, str(exc))
        else:
            req.respond(200, b"")

    # ------------------------------------------------------------------ inference

    def _infer(self, req: Request, name: str, version: str | None) -> None:
        try:
            inst = self.core.admit_request(name, version)
        except Refusal as exc:
            self._refuse(req, exc)
            return
        except UnknownModel as exc:
            req.error(400, str(exc))
            return
        enc = req.headers.get(b"content-encoding")
        hl = req.headers.get(b"inference-header-content-length")
        if enc is not None or self.offload_decode(len(req.body), hl):
            # Decompressing or parsing a large JSON tensor takes milliseconds: off the event loop,
            # so other connections keep being served meanwhile.
            self.core.pin(inst)  # keeps the instance from retiring while we decode
            self.state.decoded_off_loop += 1
            fut = asyncio.get_running_loop().run_in_executor(None, self._decode, req, inst, enc, hl)
            fut.add_done_callback(lambda f: self._decoded(req, inst, f))
            return
        try:
            decoded = decode_infer(req.body, hl, inst, self.shm, self.limits)
        except BadRequest as exc:
            self._bad(req, inst, exc)
            return
        self._submit(req, inst, decoded)

    OFFLOAD_BYTES = 256 * 1024

    @classmethod
    def offload_decode(cls, body_len: int, header_len: bytes | None) -> bool:
        """Whether an uncompressed body is decoded off the loop: only when its JSON part is large.

        The JSON part is the whole body, or its first ``Inference-Header-Content-Length`` bytes
        when binary tensors follow. Binary tensors are views of the body (``np.frombuffer``,
        microseconds at any size), so sending them to a thread would only add two thread
        hand-offs a request. It did: every 602 KB EfficientNet-Lite0 request went through the
        executor, reached the batcher later, and batches at 8 clients on 16 cores held 3.1
        images over HTTP against 3.7 over gRPC (decoded on the loop) and 3.8 for Triton.
        """
        json_len = int(header_len) if header_len is not None and header_len.isdigit() else body_len
        return min(json_len, body_len) > cls.OFFLOAD_BYTES

    def _decode(self, req: Request, inst: ModelInstance, enc: bytes | None, hl: bytes | None) -> Any:
        body = req.body
        if enc is not None:
            if enc.lower() not in (b"gzip", b"deflate"):
                enc = enc[:40]
                raise BadRequest(f"Content-Encoding {enc.decode(errors='replace')!r} is not supported; "
                                 "use gzip, deflate or none")
            body = self._decompress(body, enc.lower())
        return decode_infer(body, hl, inst, self.shm, self.limits)

    def _decoded(self, req: Request, inst: ModelInstance, fut: Any) -> None:
        self.core.unpin(inst)
        if req.cancelled:
            return
        exc = fut.exception()
        if isinstance(exc, BadRequest):
            self._bad(req, inst, exc)
        elif exc is not None:
            log.error("decoding a request failed: %r", exc)
            self.core.refused(inst, req.received)
            req.error(500, f"internal error decoding the request: {type(exc).__name__}")
        else:
            self._submit(req, inst, fut.result())

    def _bad(self, req: Request, inst: ModelInstance, exc: BadRequest) -> None:
        self.core.refused(inst, req.received)
        req.error(exc.status, str(exc))

    def _submit(self, req: Request, inst: ModelInstance, decoded: Any) -> None:
        doc, arrays, n, outputs, binary_out = decoded
        # The answer is counted in --max-buffered-mb before it is computed (released once sent),
        # so answers that clients do not read cannot pile up past it (docs/hardening.md).
        expected = answer_bytes(inst.output_specs, n)
        if expected > ANSWER_WINDOW:
            if not self.state.reserve(expected):
                self.state.refused["buffered"] = self.state.refused.get("buffered", 0) + 1
                self.core.refused(inst, req.received)
                req.error(503, ANSWERS_FULL, [(b"retry-after", b"1")])
                return
            req.reserved += expected
        rid = doc.get("id")
        wanted = [o[0] for o in outputs] if outputs is not None else None
        out_list = outputs if outputs is not None else [(s, binary_out, 0, None) for s in inst.output_specs]
        # The request keeps its entry (a client that leaves marks it cancelled) and the entry its
        # request: _deliver breaks that cycle, which otherwise held every body and answer until a
        # full garbage collection (EfficientNet-Lite0's 600 KB bodies: 80 MB after 400 requests).
        req.state = self.core.enqueue(inst, arrays, n, wanted, self._deliver, self._encoder(inst, out_list, rid),
                                      (req, inst))

    def _decompress(self, body: bytes | bytearray, enc: bytes) -> bytes:
        wbits = 31 if enc == b"gzip" else 15
        d = zlib.decompressobj(wbits)
        try:
            out = d.decompress(body, self.max_body + 1)
        except zlib.error as exc:
            raise BadRequest(f"request body is not valid {enc.decode()} data: {exc}") from None
        if len(out) > self.max_body or d.unconsumed_tail:
            raise BadRequest(f"decompressed request body exceeds the limit of {self.max_body} bytes", 413)
        return out

    @staticmethod
    def _encoder(inst: ModelInstance, out_list: list[tuple[str, bool, int, OutputTarget | None]],
                 rid: Any) -> Callable[[Pending], tuple[int, Any, bytes, list[tuple[bytes, bytes]] | None] | None]:
        name, version = inst.name, inst.version

        def encode(p: Pending) -> tuple[int, Any, bytes, list[tuple[bytes, bytes]] | None] | None:
            result = p.result
            assert result is not None
            outs = []
            blobs: list[bytes] = []
            for oname, binary, cls, target in out_list:
                arr = result[oname]
                if cls:
                    shape, strings = classify(arr, cls)
                    entry: dict[str, Any] = {"name": oname, "datatype": "BYTES", "shape": shape}
                    if binary:
                        blob = serialize_bytes(strings)
                        entry["parameters"] = {"binary_data_size": len(blob)}
                        blobs.append(blob)
                    else:
                        entry["data"] = [s.decode() for s in strings]
                else:
                    entry = {"name": oname, "datatype": datatype_of(arr.dtype), "shape": list(arr.shape)}
                    if binary:
                        blob = np.ascontiguousarray(arr).tobytes()
                        entry["parameters"] = {"binary_data_size": len(blob)}
                        blobs.append(blob)
                    else:
                        entry["data"] = finite_json_list(arr)
                if target is not None:
                    try:
                        _to_shared_memory(entry, blobs, target, strings if cls else arr)
                    except SharedMemoryError as exc:  # the client's region is too small: its error
                        p.error = (exc.status, str(exc))
                        return None
                outs.append(entry)
            doc: dict[str, Any] = {"model_name": name, "model_version": version, "outputs": outs}
            if rid is not None:
                doc["id"] = rid
            js = json.dumps(doc, separators=(",", ":")).encode()
            if blobs:
                return 200, [js, *blobs], _OCTET, [(b"inference-header-content-length", str(len(js)).encode())]
            return 200, js, _JSON, None

        return encode

    def _deliver(self, p: Pending) -> None:
        req, inst = p.ctx
        req.state = p.ctx = None  # the cycle request <-> entry (see _infer)
        out = self.core.settle(p, inst, req.received, client_gone=req.cancelled)
        if req.cancelled:
            return
        if not out.ok:
            req.error(out.status, out.message)
        else:
            status, body, ctype, headers = out.body
            req.respond(status, body, ctype, headers)
