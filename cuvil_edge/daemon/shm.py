"""Triton's system shared-memory extension: tensors in POSIX shared memory, named by region.

A client (a camera process on the same board, say) creates a POSIX shared-memory object
(``shm_open``, visible as ``/dev/shm/<key>``), registers a *region* of it with the daemon
(``name``, ``key``, ``offset``, ``byte_size``), then names the region in an infer request instead
of sending bytes: inputs and outputs carry the parameters ``shared_memory_region``,
``shared_memory_byte_size`` and optionally ``shared_memory_offset`` (Triton's
``docs/protocol/extension_shared_memory.md``). The daemon opens the object once at
registration; inputs are copied out of it and outputs into it with ``pread``/``pwrite`` on that
descriptor, never through a memory mapping: the client owns the object and may shrink it
(``truncate``) at any time, and a load or store through a mapping past the new end is a SIGBUS
that kills the process, while ``pread`` returns short and the request gets a clear error. The
copy is the same one a body costs, and an input counts against the same limit as a body
(``--max-body-mb``, :attr:`SharedMemoryRegistry.max_input_bytes`), so a sparse multi-GB region
cannot make the daemon allocate more than a request body could.

Untrusted input costs little: a key must be a plain POSIX shared-memory name (one component, no
path, no ``..``), the object must be a regular file at least ``offset + byte_size`` long, every
offset and size a request names is checked against the region *before* any memory is touched,
and the number of regions is bounded. CUDA shared memory is refused with a clear error until the
TensorRT backend brings device buffers.
"""

from __future__ import annotations

import io
import logging
import os
import re
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cuvil_edge.errors import DaemonError

__all__ = ["CUDA_SHM_UNSUPPORTED", "OutputTarget", "SharedMemoryError", "SharedMemoryRegistry",
           "ShmRegion", "shm_params", "shm_route"]

log = logging.getLogger("cuvil_edge.daemon.shm")

CUDA_SHM_UNSUPPORTED = ("CUDA shared memory is not supported by cuvil-edged yet (it comes with the "
                        "TensorRT backend); use system shared memory: on Jetson the CPU and GPU share "
                        "the same DRAM, see docs/daemon.md")

# One path component of a POSIX shm name: what shm_open(3) accepts after the leading slash.
_KEY = re.compile(r"^/?([A-Za-z0-9_][A-Za-z0-9._-]{0,254})$")


class SharedMemoryError(DaemonError):
    """A shared-memory request the client must fix; ``status`` is the HTTP code (400 or 404)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class ShmRegion:
    """One registered region: ``byte_size`` bytes at ``offset`` of the shm object ``key``."""

    name: str
    key: str
    offset: int
    byte_size: int
    file: io.FileIO  # closed when the last holder (registry, request in flight) lets go

    def status(self) -> dict[str, Any]:
        """Triton's status entry."""
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


@dataclass
class OutputTarget:
    """Where one output goes: ``byte_size`` bytes at ``offset`` inside ``region``."""

    region: ShmRegion
    offset: int
    byte_size: int


def shm_params(params: Any, where: str) -> tuple[str, int, int] | None:
    """``(region, offset, byte_size)`` from a tensor's parameters, or None without a region.

    ``params`` is a plain dict (HTTP JSON) whose values are ints/strings.

    Raises:
        SharedMemoryError: a region without a valid byte size, or a negative offset.
    """
    region = params.get("shared_memory_region")
    if region is None:
        return None
    if not isinstance(region, str) or not region:
        raise SharedMemoryError(f"{where}: shared_memory_region must be a region name")
    size = params.get("shared_memory_byte_size")
    offset = params.get("shared_memory_offset", 0)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise SharedMemoryError(f"{where}: shared_memory_byte_size must be a non-negative integer "
                                f"with shared_memory_region, got {size!r}")
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise SharedMemoryError(f"{where}: shared_memory_offset must be a non-negative integer, got {offset!r}")
    return region, offset, size


class SharedMemoryRegistry:
    """The registered system shared-memory regions (shared by the HTTP and gRPC front ends).

    Args:
        root (Path | None): where POSIX shared-memory objects live. Defaults to ``/dev/shm``.
        max_regions (int): regions registered at once, at most. Defaults to 64.
        max_input_bytes (int): largest input read from a region, as ``--max-body-mb`` bounds a
            body (413 beyond it). Defaults to 64 MiB.
    """

    def __init__(self, root: Path | None = None, max_regions: int = 64, max_input_bytes: int = 64 << 20) -> None:
        self.root = Path("/dev/shm") if root is None else Path(root)
        self.max_regions = max_regions
        self.max_input_bytes = max_input_bytes
        self._regions: dict[str, ShmRegion] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._regions)

    # ------------------------------------------------------------------ register / unregister

    def register(self, name: str, key: str, offset: int, byte_size: int) -> ShmRegion:
        """Map ``byte_size`` bytes at ``offset`` of the object ``key`` as region ``name``.

        Raises:
            SharedMemoryError: a bad name or key, a key that is not a shm object, a region past
                the object's end, a name already registered, or too many regions.
        """
        if not isinstance(name, str) or not name or len(name) > 256:
            raise SharedMemoryError("a shared-memory region needs a name of 1 to 256 characters")
        m = _KEY.match(key) if isinstance(key, str) else None
        if m is None or m.group(1) in (".", ".."):
            raise SharedMemoryError(
                f"shared-memory key {key!r} for region '{name}' is not a POSIX shared-memory name: use "
                "'/name' (one component of letters, digits, '.', '_', '-'; no paths)")
        for field_name, value in (("offset", offset), ("byte_size", byte_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise SharedMemoryError(f"region '{name}': {field_name} must be a non-negative integer, "
                                        f"got {value!r}")
        if byte_size == 0:
            raise SharedMemoryError(f"region '{name}': byte_size must be positive")
        with self._lock:
            if name in self._regions:
                raise SharedMemoryError(f"shared memory region '{name}' is already registered; "
                                        "unregister it first")
            if len(self._regions) >= self.max_regions:
                raise SharedMemoryError(f"too many shared-memory regions ({self.max_regions}); "
                                        "unregister some first")
            path = self.root / m.group(1)
            try:
                fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError as exc:
                raise SharedMemoryError(f"region '{name}': cannot open shared-memory key {key!r}: "
                                        f"{exc.strerror or exc}") from None
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise SharedMemoryError(f"region '{name}': key {key!r} is not a shared-memory object")
                end = offset + byte_size
                if end > st.st_size:
                    raise SharedMemoryError(
                        f"region '{name}': offset {offset} + byte_size {byte_size} = {end} exceeds the "
                        f"{st.st_size} bytes of shared-memory key {key!r}")
                file = io.FileIO(fd, "r+", closefd=True)
            except BaseException:
                os.close(fd)
                raise
            region = ShmRegion(name, key, offset, byte_size, file)
            self._regions[name] = region
        log.info("shared memory: registered region %s (key %s, offset %d, %d bytes)", name, key, offset, byte_size)
        return region

    def unregister(self, name: str | None = None) -> list[str]:
        """Forget region ``name`` (or every region when ``name`` is empty).

        Requests already holding the region finish with it: its descriptor is closed once nothing
        refers to it any more.

        Raises:
            SharedMemoryError: ``name`` is not registered (404).
        """
        with self._lock:
            if name:
                region = self._regions.pop(name, None)
                if region is None:
                    raise SharedMemoryError(f"shared memory region '{name}' is not registered", 404)
                gone = [region]
            else:
                gone = list(self._regions.values())
                self._regions.clear()
        return [r.name for r in gone]

    def close(self) -> None:
        """Unregister everything (shutdown)."""
        self.unregister(None)

    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        """Status entries of every region, or of ``name``.

        Raises:
            SharedMemoryError: ``name`` is not registered (404).
        """
        with self._lock:
            if name:
                region = self._regions.get(name)
                if region is None:
                    raise SharedMemoryError(f"shared memory region '{name}' is not registered", 404)
                return [region.status()]
            return [r.status() for r in self._regions.values()]

    # ------------------------------------------------------------------ tensors

    def _region(self, name: str, where: str) -> ShmRegion:
        region = self._regions.get(name)
        if region is None:
            raise SharedMemoryError(f"{where}: shared memory region '{name}' is not registered")
        return region

    @staticmethod
    def _check_bounds(region: ShmRegion, offset: int, size: int, where: str) -> None:
        if offset + size > region.byte_size:
            raise SharedMemoryError(
                f"{where}: shared_memory_offset {offset} + shared_memory_byte_size {size} exceeds the "
                f"{region.byte_size} bytes of region '{region.name}'")

    def input_array(self, name: str, offset: int, size: int, dtype: np.dtype, shape: list[int],
                    where: str) -> np.ndarray:
        """The input tensor copied out of region ``name`` (bounds and size limit checked first).

        Raises:
            SharedMemoryError: unknown region, out of bounds, over ``max_input_bytes`` (413), a
                size that does not match the shape, or an object shrunk since registration.
        """
        region = self._region(name, where)
        self._check_bounds(region, offset, size, where)
        if size > self.max_input_bytes:
            raise SharedMemoryError(f"{where}: shared_memory_byte_size {size} exceeds the limit of "
                                    f"{self.max_input_bytes} bytes for one input (--max-body-mb)", 413)
        count = 1
        for d in shape:
            count *= d
        expected = count * dtype.itemsize
        if size != expected:
            raise SharedMemoryError(f"{where}: shared_memory_byte_size {size} does not match shape {shape} "
                                    f"({expected} bytes)")
        arr = np.empty(shape, dtype)
        _read_exact(region, region.offset + offset, arr.reshape(-1).data.cast("B"), where)
        return arr

    def output_target(self, name: str, offset: int, size: int, where: str) -> OutputTarget:
        """Check an output's region and bounds at request time; :meth:`write` fills it later.

        Raises:
            SharedMemoryError: unknown region or out of bounds.
        """
        region = self._region(name, where)
        self._check_bounds(region, offset, size, where)
        return OutputTarget(region, offset, size)

    @staticmethod
    def write(target: OutputTarget, data: bytes | np.ndarray, where: str) -> int:
        """Copy an output into its region; returns the bytes written.

        Raises:
            SharedMemoryError: the output is larger than ``shared_memory_byte_size``.
        """
        buf = memoryview(np.ascontiguousarray(data).data if isinstance(data, np.ndarray) else data).cast("B")
        if buf.nbytes > target.byte_size:
            raise SharedMemoryError(f"{where}: the output has {buf.nbytes} bytes but shared_memory_byte_size "
                                    f"is {target.byte_size}")
        start = target.region.offset + target.offset
        fd = target.region.file.fileno()
        done = 0
        try:
            while done < buf.nbytes:
                done += os.pwrite(fd, buf[done:], start + done)
        except OSError as exc:
            raise SharedMemoryError(f"{where}: cannot write region '{target.region.name}': "
                                    f"{exc.strerror or exc}") from None
        return buf.nbytes


def _read_exact(region: ShmRegion, start: int, out: memoryview, where: str) -> None:
    """Fill ``out`` from ``region``'s object at ``start`` with ``pread``; a short read is an error.

    A mapping would fault (SIGBUS) where ``pread`` returns short: the object's owner may have
    truncated it since it was registered.
    """
    fd = region.file.fileno()
    done = 0
    try:
        while done < out.nbytes:
            n = os.preadv(fd, [out[done:]], start + done)
            if n <= 0:
                raise SharedMemoryError(
                    f"{where}: shared-memory key {region.key!r} of region '{region.name}' is shorter than "
                    f"when it was registered (it ends before byte {start + out.nbytes}); register it again")
            done += n
    except OSError as exc:
        raise SharedMemoryError(f"{where}: cannot read region '{region.name}': {exc.strerror or exc}") from None


def shm_route(shm: SharedMemoryRegistry | None, req: Any, parts: list[str]) -> None:
    """Serve ``/v2/systemsharedmemory/...`` and ``/v2/cudasharedmemory/...`` over HTTP.

    ``parts`` is the split path (``["", "v2", "systemsharedmemory", ...]``); ``req`` is the HTTP
    :class:`~cuvil_edge.daemon.http.Request`. Status is a JSON list of regions, as Triton's.
    """
    import json
    from urllib.parse import unquote

    if parts[2] == "cudasharedmemory":
        req.error(400, CUDA_SHM_UNSUPPORTED)
        return
    if shm is None:
        req.error(400, "system shared memory is not enabled on this daemon")
        return
    rest = parts[3:]
    name = None
    if len(rest) >= 3 and rest[0] == "region":
        name = unquote(rest[1])
        rest = rest[2:]
    action = rest[0] if len(rest) == 1 else ""
    try:
        if action == "status":
            if req.method != b"GET":
                req.error(405, "use GET for shared-memory status")
                return
            req.respond(200, json.dumps(shm.status(name)).encode())
        elif action in ("register", "unregister"):
            if req.method != b"POST":
                req.error(405, f"use POST to {action} a shared-memory region")
                return
            if action == "unregister":
                shm.unregister(name)
            elif name is None:
                req.error(404, "register needs a region: /v2/systemsharedmemory/region/{name}/register")
                return
            else:
                try:
                    doc = json.loads(req.body or b"{}")
                except ValueError:
                    req.error(400, f"malformed JSON in the register request of region '{name}'")
                    return
                if not isinstance(doc, dict):
                    req.error(400, "the register request must be a JSON object with key, offset, byte_size")
                    return
                shm.register(name, doc.get("key"), doc.get("offset", 0), doc.get("byte_size"))  # type: ignore[arg-type]  # register checks each
            req.respond(200, b"")
        else:
            req.error(404, f"no such endpoint: {req.path}")
    except SharedMemoryError as exc:
        req.error(exc.status, str(exc))
