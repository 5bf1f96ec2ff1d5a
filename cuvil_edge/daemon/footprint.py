"""What the daemon's process keeps resident once its models are loaded and warm.

Three hand-backs, each run after start-up and after a store reload (loading is what grows them):

* :func:`freeze_heap`: Python objects alive now (modules, sessions, manifests) leave the garbage
  collector's generations, so later collections walk only young objects.
* :func:`trim_heap`: the C heap's free pages go back to the kernel (glibc's ``malloc_trim``).
* :func:`page_out_libraries`: the pages of shared libraries that loading read (ONNX Runtime
  registers every kernel it has, grpc core and numpy initialise their tables) are handed back
  (``MADV_PAGEOUT``). Serving faults back the few it runs. Measured on the tiny CNN, 2-core x86,
  kernel 6.18: RSS 107.6 -> 89.0 MB, 89.4 MB after 50 requests; the first request took 7.5 ms
  instead of 2.5. A library page another process maps too (the client's libpython, say) stays.
  These pages are clean: the kernel would drop them under memory pressure anyway, so this takes
  nothing a model needs and makes the room free at once instead of when the GPU asks for it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import gc
import logging
import os
import re
from pathlib import Path

log = logging.getLogger("cuvil_edge.daemon")

MADV_PAGEOUT = 21  # Linux 5.4 (<asm-generic/mman-common.h>); JetPack 5 runs 5.10, JetPack 6 5.15
_SHARED_OBJECT = re.compile(r"\.so(\.[0-9.]+)?$")  # libfoo.so, libc.so.6, libpython3.10.so.1.0


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name, use_errno=True) if name else None
    except OSError:
        return None


def freeze_heap() -> None:
    """Collect once, then move every object alive now out of the garbage collector's generations
    (``gc.freeze``), so the periodic full collections that request garbage triggers only walk
    young objects: fewer multi-millisecond pauses in p99."""
    gc.collect()
    gc.freeze()


def trim_heap() -> None:
    """Hand the C heap's free pages back to the kernel (glibc's ``malloc_trim``): loading and
    warming models frees tens of MB that glibc keeps mapped otherwise (measured on
    EfficientNet-Lite0: about 20 MB). A no-op where the C library has no such call."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def library_ranges(maps: str) -> list[tuple[int, int, str]]:
    """The read-only mappings of shared objects in a ``/proc/PID/maps`` text: ``(start, end, path)``.

    Only ``.so`` files: not model files a runtime maps (their pages are the weights every run
    reads), not devices (``/dev/nvmap`` and other driver mappings), nothing writable (a library's
    data, shared-memory regions)."""
    out: list[tuple[int, int, str]] = []
    for line in maps.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or "w" in parts[1] or not parts[5].startswith("/") or parts[5].startswith("/dev/"):
            continue
        if not _SHARED_OBJECT.search(parts[5]):
            continue
        lo, _, hi = parts[0].partition("-")
        out.append((int(lo, 16), int(hi, 16), parts[5]))
    return out


def resident_bytes() -> int:
    """This process's resident set, bytes (0 where ``/proc`` is missing)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


def page_out_libraries() -> int:
    """Advise the kernel to reclaim this process's library pages (``MADV_PAGEOUT``); returns the
    bytes the resident set shrank by (0 when the kernel or the C library cannot, logged why)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return 0
    libc = _libc()
    if libc is None or not hasattr(libc, "madvise"):
        return 0
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    before = resident_bytes()
    ranges = library_ranges(maps)
    refused: dict[int, int] = {}
    for lo, hi, path in ranges:
        if libc.madvise(lo, hi - lo, MADV_PAGEOUT) != 0:
            err = ctypes.get_errno()
            refused[err] = refused.get(err, 0) + 1
            if err in (errno.EPERM, errno.ENOSYS):  # a seccomp filter: no mapping will take it
                break
            log.debug("madvise(MADV_PAGEOUT) on %s: %s", path, os.strerror(err))  # EINVAL: a locked mapping
    if (ranges and sum(refused.values()) >= len(ranges)) or refused.keys() & {errno.EPERM, errno.ENOSYS}:
        why = ", ".join(os.strerror(e) for e in refused)
        log.info("library pages stay resident: madvise(MADV_PAGEOUT) refused (%s; a kernel before 5.4 or a "
                 "system-call filter)", why)
        return 0
    freed = max(0, before - resident_bytes())
    log.info("handed back %.1f MB of library pages loading read (resident %.1f MB)",
             freed / 1048576, resident_bytes() / 1048576)
    return freed
