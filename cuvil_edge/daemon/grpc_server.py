"""KServe v2 over gRPC: Triton's ``inference.GRPCInferenceService``, served from the daemon's event loop.

Stock ``tritonclient.grpc`` (sync, aio, and the bidirectional ``ModelStreamInfer`` stream) talks
to it unchanged: the messages are Triton's (``cuvil_edge/daemon/proto``). It is a second front
end on the same objects as HTTP, not a second server: its calls are handled on the daemon's
asyncio loop (the transport, :mod:`cuvil_edge.daemon.grpc_cq`, drives grpc core's completion
queue), requests go to the same :class:`~cuvil_edge.daemon.models.ModelRegistry` and batchers
(HTTP and gRPC requests batch together), through the same memory-pressure check (refusals are
``RESOURCE_EXHAUSTED`` with ``retry-after`` seconds and ``grpc-retry-pushback-ms`` in the
trailing metadata) and the same bearer token (``authorization: Bearer <token>`` metadata; the
scheme is case-insensitive). Health RPCs stay open, as ``/v2/health/*`` does over HTTP.

Untrusted input costs little (:mod:`cuvil_edge.daemon.grpc_calls` has the rules): the token is
checked when the call starts, from its metadata, before the request message is read; messages
over ``--grpc-max-message-mb`` (default: ``--max-body-mb``) are refused by gRPC's core from the
length prefix; HTTP/2 streams per connection, calls in progress and requests in flight per
stream are bounded.

Tensors travel in ``raw_input_contents`` / ``raw_output_contents`` (as tritonclient sends them),
in typed ``contents``, or in system shared memory (:mod:`cuvil_edge.daemon.shm`). The answer is
serialized where the batch ran (a worker thread, or the loop for a model that runs inline), so
the loop only moves bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format

from cuvil_edge import __version__
from cuvil_edge.daemon.accept import connection_cap
from cuvil_edge.daemon.batcher import Pending
from cuvil_edge.daemon.config import Config
from cuvil_edge.daemon.grpc_calls import WINDOW, CallPolicy, Malformed, Method, RpcFailure, parser_for
from cuvil_edge.daemon.grpc_cq import CompletionQueueServer, check_core
from cuvil_edge.daemon.infer import (
    BadRequest,
    InferenceCore,
    MemoryRefused,
    Outcome,
    Refusal,
    check_input_header,
    classify,
    complete_inputs,
    serialize_bytes,
)
from cuvil_edge.daemon.kserve import EXTENSIONS, App, model_config_doc, model_metadata_doc
from cuvil_edge.daemon.models import ModelInstance, UnknownModel
from cuvil_edge.daemon.proto import grpc_service_pb2 as pb
from cuvil_edge.daemon.proto import model_config_pb2 as config_pb
from cuvil_edge.daemon.shm import (
    CUDA_SHM_UNSUPPORTED,
    OutputTarget,
    SharedMemoryError,
    SharedMemoryRegistry,
    shm_params,
)
from cuvil_edge.errors import CuvilEdgeError, DaemonError
from cuvil_edge.runtime.base import datatype_of

__all__ = ["DEFAULT_GRPC_PORT", "GrpcFrontend", "RpcFailure", "decode_grpc_infer", "grpc_address"]

log = logging.getLogger("cuvil_edge.daemon.grpc")
access = logging.getLogger("cuvil_edge.daemon.access")  # --access-log

DEFAULT_GRPC_PORT = 8001  # Triton's
SERVICE = "inference.GRPCInferenceService"
_OPEN_METHODS = frozenset({"ServerLive", "ServerReady"})
_BEARER = re.compile(rb"^bearer[ \t]+(\S+)[ \t]*$", re.IGNORECASE)

# InferTensorContents field per KServe datatype (FP16/BF16 travel raw only).
_CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


_HTTP_TO_GRPC = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
                 404: grpc.StatusCode.NOT_FOUND, 413: grpc.StatusCode.RESOURCE_EXHAUSTED,
                 500: grpc.StatusCode.INTERNAL, 503: grpc.StatusCode.UNAVAILABLE,
                 507: grpc.StatusCode.RESOURCE_EXHAUSTED}


def _refusal(exc: Refusal) -> RpcFailure:
    """The core's refusal as gRPC says it: memory pressure is RESOURCE_EXHAUSTED (what gRPC's
    retry policy reads, with ``grpc-retry-pushback-ms``), the rest UNAVAILABLE; both carry
    ``retry-after`` seconds when a retry may succeed."""
    code = grpc.StatusCode.RESOURCE_EXHAUSTED if exc.reason == "pressure" else grpc.StatusCode.UNAVAILABLE
    trailing: tuple[tuple[str, str], ...] = ()
    if exc.retry_after is not None:
        trailing = (("retry-after", str(exc.retry_after)), ("grpc-retry-pushback-ms", str(exc.retry_after * 1000)))
    return RpcFailure(code, str(exc), trailing)


def grpc_address(config: Config) -> str | None:
    """Where gRPC listens for this config, as a gRPC address, or None when it is off.

    ``--grpc-uds PATH`` wins; else ``--grpc-port`` on ``--host``. Unset, the port is Triton's
    8001, except that ``--port 0`` (pick a free port) picks one for gRPC too, and a daemon told
    to listen on ``--uds`` only listens on a Unix socket beside it (``NAME-grpc.sock``), so that
    no TCP port opens that the operator did not ask for.
    """
    if not config.grpc:
        return None
    if config.grpc_uds is not None:
        return f"unix:{Path(config.grpc_uds)}"
    port = config.grpc_port
    if port is None:
        if config.uds is not None:
            uds = Path(config.uds)
            return f"unix:{uds.with_name(uds.stem + '-grpc.sock')}"
        port = 0 if config.port == 0 else DEFAULT_GRPC_PORT
    host = config.host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def _param(p: Any) -> Any:
    kind = p.WhichOneof("parameter_choice")
    return getattr(p, kind) if kind else None


def _params(m: Any) -> dict[str, Any]:
    return {k: _param(v) for k, v in m.items()}


def decode_grpc_infer(req: Any, inst: ModelInstance, shm: SharedMemoryRegistry | None,
                      ) -> tuple[dict[str, np.ndarray], int, list[tuple[str, int, OutputTarget | None]] | None]:
    """Check a ``ModelInferRequest`` against the model; the same rules and messages as HTTP.

    Returns:
        (input arrays, batch size, requested outputs [(name, class_count, shm target)] or None for all).

    Raises:
        RpcFailure: INVALID_ARGUMENT with the message for the client.
    """
    try:
        return _decode(req, inst, shm)
    except SharedMemoryError as exc:
        raise RpcFailure(_HTTP_TO_GRPC.get(exc.status, grpc.StatusCode.INVALID_ARGUMENT), str(exc)) from None


def _bad(message: str) -> RpcFailure:
    return RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, message)


def _decode(req: Any, inst: ModelInstance, shm: SharedMemoryRegistry | None,
            ) -> tuple[dict[str, np.ndarray], int, list[tuple[str, int, OutputTarget | None]] | None]:
    if not req.inputs:
        raise _bad("the inference request needs at least one input")
    raw = req.raw_input_contents
    next_raw = 0
    arrays: dict[str, np.ndarray] = {}
    for item in req.inputs:
        name = item.name
        shape = list(item.shape)
        try:
            spec = check_input_header(inst, arrays, name, shape, item.datatype)
        except BadRequest as exc:
            raise _bad(str(exc)) from None
        count = 1
        for d in shape:
            count *= d
        dtype = spec.dtype
        # Most requests carry no parameters: skip building the dict and the message for them.
        region = shm_params(_params(item.parameters), f"input '{name}'") if item.parameters else None
        if region is not None:
            if shm is None:
                raise _bad("system shared memory is not enabled on this daemon")
            arr = shm.input_array(region[0], region[1], region[2], dtype, shape, f"input '{name}'")
        elif item.HasField("contents"):
            field = _CONTENTS_FIELD.get(spec.datatype)
            values = getattr(item.contents, field) if field else ()
            if len(values) != count:
                raise _bad(f"input '{name}': {len(values)} elements given in contents for shape {shape} "
                           f"({count} expected)")
            arr = np.asarray(values, dtype=dtype).reshape(shape)
        else:
            if next_raw >= len(raw):
                raise _bad(f"input '{name}' has no data: raw_input_contents holds {len(raw)} entries for "
                           f"{len(req.inputs)} inputs")
            blob = raw[next_raw]
            next_raw += 1
            expected = count * dtype.itemsize
            if len(blob) != expected:
                raise _bad(f"input '{name}': raw_input_contents has {len(blob)} bytes; shape {shape} of "
                           f"{spec.datatype} needs {expected}")
            arr = np.frombuffer(blob, dtype, count).reshape(shape)
        arrays[name] = arr
    if next_raw != len(raw):
        raise _bad(f"raw_input_contents has {len(raw) - next_raw} entries that no input claims")
    try:
        n = complete_inputs(inst, arrays)
    except BadRequest as exc:
        raise _bad(str(exc)) from None
    outputs: list[tuple[str, int, OutputTarget | None]] | None = None
    if req.outputs:
        outputs = []
        for o in req.outputs:
            if o.name not in inst.output_specs:
                raise _bad(f"unexpected inference output '{o.name}' for model '{inst.name}'; it has "
                           f"{sorted(inst.output_specs)}")
            params = _params(o.parameters)
            cls = params.get("classification", 0)
            if not isinstance(cls, int) or isinstance(cls, bool) or cls < 0:
                raise _bad(f"output '{o.name}': classification must be a non-negative integer")
            region = shm_params(params, f"output '{o.name}'")
            target = None
            if region is not None:
                if shm is None:
                    raise _bad("system shared memory is not enabled on this daemon")
                target = shm.output_target(region[0], region[1], region[2], f"output '{o.name}'")
            outputs.append((o.name, cls, target))
    return arrays, n, outputs


class GrpcFrontend:
    """The gRPC front end of one daemon.

    Args:
        app (App): the HTTP application: its registry, server state and inference core are shared.
        config (Config): the daemon's settings.
        shm (SharedMemoryRegistry | None): the shared-memory regions (shared with HTTP).
    """

    def __init__(self, app: App, config: Config, shm: SharedMemoryRegistry | None) -> None:
        self.app = app
        self.registry = app.registry
        self.state = app.state
        self.config = config
        self.shm = shm
        token = config.token
        self.token = token.encode() if token else None
        self.server: CompletionQueueServer | None = None
        self.bound: str | None = None
        self.uds: Path | None = None
        self.calls: dict[tuple[str, str], int] = {}  # (method, status code) -> count
        self.policy: CallPolicy | None = None  # set by start()
        self.core: InferenceCore = app.core
        self.methods = self._methods()

    # ------------------------------------------------------------------ limits and binding

    @property
    def max_message_bytes(self) -> int:
        """Largest request message accepted (``--grpc-max-message-mb``, else ``--max-body-mb``)."""
        mb = self.config.grpc_max_message_mb or self.config.max_body_mb
        return int(mb * 1024 * 1024)

    def server_options(self) -> list[tuple[str, Any]]:
        """gRPC core channel arguments that carry the daemon's limits."""
        cfg = self.config
        return [
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_send_message_length", max(self.max_message_bytes, 64 << 20)),
            ("grpc.max_concurrent_streams", int(cfg.grpc_max_streams)),
            # As HTTP's header limit (--max-header-kb where the daemon has it, else 64 KiB).
            ("grpc.max_metadata_size", int(cfg.max_header_kb) * 1024),
            ("grpc.max_connection_idle_ms", int(cfg.keep_alive * 1000)),
            # A connection that has not answered a ping within --request-timeout is closed with
            # everything its calls hold (a client that stopped reading its socket altogether).
            ("grpc.keepalive_time_ms", int(cfg.keep_alive * 1000)),
            ("grpc.keepalive_timeout_ms", int(cfg.request_timeout * 1000)),
            ("grpc.http2.ping_timeout_ms", int(cfg.request_timeout * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),  # keep-alive pings go out while data is blocked
            # Every reset a client sends is answered with a PING (grpcio: 1 %); a rapid-reset client
            # that does not answer them is closed after --request-timeout, and one that does not
            # read them is slowed down (chttp2 stops reading past 10,000 unsent induced frames).
            ("grpc.http2.ping_on_rst_stream_percent", 100),
            # --max-connections bounds this listener as it bounds HTTP's (each counts its own):
            # gRPC core closes a connection over the cap right after accepting it, before it
            # reads a byte, so a flood of clients costs a socket each for an instant.
            ("grpc.max_allowed_incoming_connections", connection_cap(int(cfg.max_connections))),
            ("grpc.so_reuseport", 0),  # a port in use is an error, as for HTTP
            # A stream nobody reads (a health call, a call refused from its headers) can be sent
            # one HTTP/2 window only; a read in progress opens the window to its message size.
            ("grpc.http2.lookahead_bytes", WINDOW),
        ]

    async def start(self) -> str:
        """Bind and start serving; returns the bound address (``grpc://host:port`` or ``grpc+unix:``).

        Raises:
            DaemonError: the address cannot be bound.
        """
        address = grpc_address(self.config)
        assert address is not None
        if address.startswith("unix:"):
            path = Path(address[5:])
            if path.exists() or path.is_symlink():
                if not stat.S_ISSOCK(path.lstat().st_mode):
                    raise DaemonError(f"--grpc-uds {path}: exists and is not a socket; remove it or pick another path")
                path.unlink()
            self.uds = path
        # Calls in progress are counted by the call policy (grpc_calls.py), not by grpc core's
        # max_concurrent_streams alone, which counts half-open health streams too.
        check_core()
        policy = self.policy = CallPolicy(self, self.methods, int(self.config.grpc_max_rpcs))
        self.server = CompletionQueueServer(asyncio.get_running_loop(), self.server_options(), self.policy.on_call,
                                             admit=self.policy.admit,
                                             message_timeout=lambda: policy.timeout)
        server = self.server
        self.policy.burst = lambda: server.more
        try:
            port = self.server.bind(address)
        except RuntimeError as exc:
            raise DaemonError(f"cannot listen for gRPC on {address}: {exc}; pick another --grpc-port "
                              "or turn gRPC off with --grpc 0") from exc
        if port == 0 and self.uds is None:
            raise DaemonError(f"cannot listen for gRPC on {address}: the port is in use or the address is "
                              "not local; pick another --grpc-port or turn gRPC off with --grpc 0")
        self.server.start()
        if self.uds is not None:
            with contextlib.suppress(OSError):
                self.uds.chmod(0o660)
            self.bound = f"grpc+unix:{self.uds}"
        else:
            host = address.rpartition(":")[0]
            self.bound = f"grpc://{host}:{port}"
        return self.bound

    async def stop(self, grace: float | None) -> None:
        """Refuse new calls, let calls in progress finish for ``grace`` seconds, close."""
        if self.server is not None:
            await self.server.stop(grace)
            self.server = None
        if self.uds is not None:
            with contextlib.suppress(OSError):
                self.uds.unlink()

    # ------------------------------------------------------------------ auth and bookkeeping

    def authorized(self, metadata: Any) -> bool:
        """Whether the call's metadata carries ``authorization: Bearer <token>``."""
        if self.token is None:
            return True
        for key, value in metadata or ():
            if key == "authorization":
                raw = value.encode() if isinstance(value, str) else bytes(value)
                m = _BEARER.match(raw)
                return m is not None and hmac.compare_digest(m.group(1), self.token)
        return False

    def count(self, method: str, code: grpc.StatusCode) -> None:
        key = (method, code.name)
        self.calls[key] = self.calls.get(key, 0) + 1
        if getattr(self.state, "access_log", False):
            access.info("gRPC %s %s", method, code.name)

    def _lookup(self, name: str, version: str) -> ModelInstance:
        try:
            return self.core.lookup(name, version or None)
        except Refusal as exc:
            raise _refusal(exc) from None
        except UnknownModel as exc:
            raise RpcFailure(grpc.StatusCode.NOT_FOUND, str(exc)) from None

    def _methods(self) -> dict[bytes, Method]:
        """Every RPC of Triton's service that the daemon serves, by full path, with its kind."""
        unary = {
            "ServerLive": (pb.ServerLiveRequest, self.server_live),
            "ServerReady": (pb.ServerReadyRequest, self.server_ready),
            "ModelReady": (pb.ModelReadyRequest, self.model_ready),
            "ServerMetadata": (pb.ServerMetadataRequest, self.server_metadata),
            "ModelMetadata": (pb.ModelMetadataRequest, self.model_metadata),
            "ModelConfig": (pb.ModelConfigRequest, self.model_config),
            "ModelStatistics": (pb.ModelStatisticsRequest, self.model_statistics),
            "RepositoryIndex": (pb.RepositoryIndexRequest, self.repository_index),
            "RepositoryModelLoad": (pb.RepositoryModelLoadRequest, self.repository_load),
            "RepositoryModelUnload": (pb.RepositoryModelUnloadRequest, self.repository_unload),
            "SystemSharedMemoryStatus": (pb.SystemSharedMemoryStatusRequest, self.shm_status),
            "SystemSharedMemoryRegister": (pb.SystemSharedMemoryRegisterRequest, self.shm_register),
            "SystemSharedMemoryUnregister": (pb.SystemSharedMemoryUnregisterRequest, self.shm_unregister),
            "CudaSharedMemoryStatus": (pb.CudaSharedMemoryStatusRequest, self.cuda_shm),
            "CudaSharedMemoryRegister": (pb.CudaSharedMemoryRegisterRequest, self.cuda_shm),
            "CudaSharedMemoryUnregister": (pb.CudaSharedMemoryUnregisterRequest, self.cuda_shm),
        }
        infer = parser_for(pb.ModelInferRequest)
        methods = [Method(name, "open" if name in _OPEN_METHODS else "unary", parser_for(request_type), fn)
                   for name, (request_type, fn) in unary.items()]
        methods += [Method("ModelInfer", "infer", infer), Method("ModelStreamInfer", "stream", infer)]
        return {f"/{SERVICE}/{m.name}".encode(): m for m in methods}

    # ------------------------------------------------------------------ health and metadata

    def server_live(self, _req: Any) -> Any:
        return pb.ServerLiveResponse(live=not self.state.stopped)

    def server_ready(self, _req: Any) -> Any:
        return pb.ServerReadyResponse(ready=bool(self.state.ready and not self.state.shutting_down))

    def model_ready(self, req: Any) -> Any:
        # Triton answers ready=false (not an error) for a model or version it does not serve.
        try:
            self.registry.get(req.name, req.version or None)
        except UnknownModel:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=True)

    def server_metadata(self, _req: Any) -> Any:
        return pb.ServerMetadataResponse(name="cuvil-edged", version=__version__, extensions=EXTENSIONS)

    def model_metadata(self, req: Any) -> Any:
        doc = model_metadata_doc(self._lookup(req.name, req.version))
        return json_format.ParseDict(doc, pb.ModelMetadataResponse())

    def model_config(self, req: Any) -> Any:
        doc = model_config_doc(self._lookup(req.name, req.version))
        # Triton's version numbers are integers; ours are bundle versions ("1.0.0"): the proto
        # carries the latest-one policy instead, the HTTP JSON the version string.
        versions = doc.pop("version_policy", {}).get("specific", {}).get("versions", [])
        if versions and all(str(v).isdigit() for v in versions):
            doc["version_policy"] = {"specific": {"versions": [int(v) for v in versions]}}
        else:
            doc["version_policy"] = {"latest": {"num_versions": 1}}
        cfg = json_format.ParseDict(doc, config_pb.ModelConfig(), ignore_unknown_fields=True)
        return pb.ModelConfigResponse(config=cfg)

    def model_statistics(self, req: Any) -> Any:
        if req.name:
            stats = [self._lookup(req.name, req.version).stats.to_dict()]
        else:
            stats = [i.stats.to_dict() for i in self.registry.instances()]
        return json_format.ParseDict({"model_stats": stats}, pb.ModelStatisticsResponse(),
                                     ignore_unknown_fields=True)

    # ------------------------------------------------------------------ repository

    def repository_index(self, req: Any) -> Any:
        items = self.registry.index()
        if req.ready:
            items = [i for i in items if i["state"] == "READY"]
        return json_format.ParseDict({"models": items}, pb.RepositoryIndexResponse(), ignore_unknown_fields=True)

    async def repository_load(self, req: Any) -> Any:
        version = _params(req.parameters).get("version")
        try:
            await self.registry.load(req.model_name, version if isinstance(version, str) else None)
        except MemoryRefused as exc:
            raise RpcFailure(grpc.StatusCode.RESOURCE_EXHAUSTED, f"failed to load '{req.model_name}': {exc}") from None
        except CuvilEdgeError as exc:
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, f"failed to load '{req.model_name}': {exc}") from None
        return pb.RepositoryModelLoadResponse()

    async def repository_unload(self, req: Any) -> Any:
        try:
            await self.registry.unload(req.model_name)
        except CuvilEdgeError as exc:
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        return pb.RepositoryModelUnloadResponse()

    # ------------------------------------------------------------------ shared memory

    def _shm(self) -> SharedMemoryRegistry:
        if self.shm is None:
            raise RpcFailure(grpc.StatusCode.UNAVAILABLE, "system shared memory is not enabled on this daemon")
        return self.shm

    @staticmethod
    def _shm_failure(exc: SharedMemoryError) -> RpcFailure:
        return RpcFailure(_HTTP_TO_GRPC.get(exc.status, grpc.StatusCode.INVALID_ARGUMENT), str(exc))

    def shm_status(self, req: Any) -> Any:
        try:
            regions = self._shm().status(req.name or None)
        except SharedMemoryError as exc:
            raise self._shm_failure(exc) from None
        out = pb.SystemSharedMemoryStatusResponse()
        for r in regions:
            out.regions[r["name"]].CopyFrom(pb.SystemSharedMemoryStatusResponse.RegionStatus(**r))
        return out

    def shm_register(self, req: Any) -> Any:
        try:
            self._shm().register(req.name, req.key, req.offset, req.byte_size)
        except SharedMemoryError as exc:
            raise self._shm_failure(exc) from None
        return pb.SystemSharedMemoryRegisterResponse()

    def shm_unregister(self, req: Any) -> Any:
        try:
            self._shm().unregister(req.name or None)
        except SharedMemoryError as exc:
            raise self._shm_failure(exc) from None
        return pb.SystemSharedMemoryUnregisterResponse()

    def cuda_shm(self, _req: Any) -> Any:
        raise RpcFailure(grpc.StatusCode.UNIMPLEMENTED, CUDA_SHM_UNSUPPORTED)

    # ------------------------------------------------------------------ inference

    def submit(self, req: Any, deliver: Callable[[Pending], None], received: float,
               at_once: bool = False) -> Pending:
        """Admit, decode and queue one request; ``deliver`` runs on the loop with the outcome
        (``at_once``: possibly before this returns, see :meth:`InferenceCore.enqueue`).

        Raises:
            RpcFailure: refused before it reached a batcher.
        """
        if isinstance(req, Malformed):
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, req.message)
        try:
            inst = self.core.admit_request(req.model_name, req.model_version or None)
        except Refusal as exc:
            raise _refusal(exc) from None
        except UnknownModel as exc:
            raise RpcFailure(grpc.StatusCode.NOT_FOUND, str(exc)) from None
        try:
            arrays, n, outputs = decode_grpc_infer(req, inst, self.shm)
        except RpcFailure:
            self.core.refused(inst, received)
            raise
        wanted = [o[0] for o in outputs] if outputs is not None else None
        out_list: list[tuple[str, int, OutputTarget | None]] = (
            outputs if outputs is not None else [(s, 0, None) for s in inst.output_specs])
        return self.core.enqueue(inst, arrays, n, wanted, deliver, self._encoder(inst, out_list, req.id),
                                (inst, received), at_once)

    @staticmethod
    def _encoder(inst: ModelInstance, out_list: list[tuple[str, int, OutputTarget | None]],
                 rid: str) -> Callable[[Pending], bytes | None]:
        name, version = inst.name, inst.version

        def encode(p: Pending) -> bytes | None:  # worker thread
            result = p.result
            assert result is not None
            resp = pb.ModelInferResponse(model_name=name, model_version=version, id=rid)
            for oname, cls, target in out_list:
                arr = result[oname]
                out = resp.outputs.add(name=oname)
                if cls:
                    shape, strings = classify(arr, cls)
                    blob = serialize_bytes(strings)
                    out.datatype = "BYTES"
                    out.shape.extend(shape)
                else:
                    out.datatype = datatype_of(arr.dtype)
                    out.shape.extend(arr.shape)
                    blob = np.ascontiguousarray(arr).tobytes()
                if target is not None:
                    try:
                        SharedMemoryRegistry.write(target, blob, f"output '{oname}'")
                    except SharedMemoryError as exc:  # the client's region is too small: its error
                        p.error = (exc.status, str(exc))
                        return None
                    out.parameters["shared_memory_region"].string_param = target.region.name
                    out.parameters["shared_memory_byte_size"].int64_param = len(blob)
                    if target.offset:
                        out.parameters["shared_memory_offset"].int64_param = target.offset
                    blob = b""  # keeps raw_output_contents aligned with outputs
                resp.raw_output_contents.append(blob)
            return resp.SerializeToString()

        return encode

    def finish_request(self, p: Pending) -> tuple[bytes | None, RpcFailure | None]:
        """Account one delivered request (loop thread); the answer bytes or the failure."""
        inst, received = p.ctx
        out: Outcome = self.core.settle(p, inst, received)
        if out.status == 499:
            return None, RpcFailure(grpc.StatusCode.CANCELLED, out.message)
        if not out.ok:
            return None, RpcFailure(_HTTP_TO_GRPC.get(out.status, grpc.StatusCode.INTERNAL), out.message)
        return out.body, None

    # ------------------------------------------------------------------ metrics

    def counters(self) -> dict[str, tuple[str, list[tuple[dict[str, str], Any]]]]:
        """gRPC counters for /metrics."""
        return {"cuvil_grpc_requests_total": (
            "gRPC calls answered, by method and status code",
            [({"method": m, "code": c}, v) for (m, c), v in sorted(self.calls.items())])}
