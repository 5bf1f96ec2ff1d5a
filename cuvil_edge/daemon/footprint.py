"""What the daemon's process keeps resident once its models are loaded and warm.

Three hand-backs, each run after start-up and after a store reload (loading is what grows them):

* :func:`freeze_heap`: Python objects alive now (modules, sessions, manifests) leave the garbage
  collector's generations, so later collections walk only young objects.
* :func:`trim_heap`: the C heap's free pages go back to the kernel (glibc's ``malloc_trim``).
* :func:`page_out_libraries`: the pages of shared libraries that loading read (ONNX Runtime
  registers every kernel it has, grpc core and numpy initialise their tables) are handed back
  (``MADV_DONTNEED`` on the mapping, then ``POSIX_FADV_DONTNEED`` on the file). Serving faults
  back the few it runs: the first request reads its code again (figures in docs/memory.md). A
  mapping another process shares (the client's libpython, say) stays.
  These pages are clean: the kernel would drop them under memory pressure anyway, so this takes
  nothing a model needs and makes the room free at once instead of when the GPU asks for it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import gc
import logging
import os
import re
from pathlib import Path

from cuvil_edge.runtime.ort import rss_bytes

__all__ = ["MADV_DONTNEED", "freeze_heap", "library_ranges", "page_out_libraries", "trim_heap"]

log = logging.getLogger("cuvil_edge.daemon")

MADV_DONTNEED = 4  # <asm-generic/mman-common.h>: the same number on x86-64 and arm64
_NOT_OURS_ALONE = ("Anonymous:", "Private_Dirty:", "Shared_Clean:", "Shared_Dirty:")  # smaps fields
_SHARED_OBJECT = re.compile(r"\.so(\.[0-9.]+)?$")  # libfoo.so, libc.so.6, libpython3.10.so.1.0


@functools.cache
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


def library_ranges(smaps: str) -> list[tuple[int, int, str]]:
    """The mappings of shared objects in a ``/proc/PID/smaps`` text that may be dropped and read
    again from their file: ``(start, end, path)``.

    Only ``.so`` files: not model files a runtime maps (their pages are the weights every run
    reads), not devices (``/dev/nvmap`` and other driver mappings). Nothing writable, and nothing
    with a page of its own (``Anonymous``, ``Private_Dirty``): a library's relocated read-only data
    is such a copy, and dropping it would read the unrelocated bytes back. Nothing with a page
    another process maps too (``Shared_*``): dropping it here frees no memory, it only moves the
    count to the other process."""
    out: list[tuple[int, int, str]] = []
    head: tuple[int, int, str] | None = None
    own = 0
    for line in smaps.splitlines() + ["0-0 ---p 0 0:0 0"]:
        parts = line.split(maxsplit=5)
        if parts and "-" in parts[0] and not parts[0].endswith(":"):  # a mapping's first line
            if head is not None and own == 0:
                out.append(head)
            head, own = None, 0
            if len(parts) < 6 or "w" in parts[1] or not parts[5].startswith("/") or parts[5].startswith("/dev/"):
                continue
            if not _SHARED_OBJECT.search(parts[5].strip()):
                continue
            lo, _, hi = parts[0].partition("-")
            head = (int(lo, 16), int(hi, 16), parts[5].strip())
        elif head is not None and parts and parts[0] in _NOT_OURS_ALONE and len(parts) > 1 and parts[1] != "0":
            own += 1
    return out


def page_out_libraries() -> int:
    """Drop this process's library pages and have the kernel forget them; returns the bytes the
    resident set shrank by (0 when it cannot, logged why).

    ``madvise(MADV_DONTNEED)`` unmaps a range's pages (a later access reads them from the file
    again), then ``posix_fadvise(POSIX_FADV_DONTNEED)`` drops the file's cached pages no process
    maps now, so the memory is free, not just uncounted. ``MADV_PAGEOUT`` would do both at once,
    but the kernel lets a process page out only the files it owns or may write
    (``can_do_file_pageout``): under the daemon's unit, not its libraries."""
    try:
        smaps = Path("/proc/self/smaps").read_text()
    except OSError:
        return 0
    libc = _libc()
    if libc is None or not hasattr(libc, "madvise") or not hasattr(os, "posix_fadvise"):
        return 0
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    before = rss_bytes()
    ranges = library_ranges(smaps)
    files: set[str] = set()
    for lo, hi, path in ranges:
        if libc.madvise(lo, hi - lo, MADV_DONTNEED) != 0:
            err = ctypes.get_errno()
            if err in (errno.EPERM, errno.ENOSYS):  # a system-call filter: no mapping will take it
                log.info("library pages stay resident: madvise refused (%s)", os.strerror(err))
                return 0
            log.debug("madvise(MADV_DONTNEED) on %s: %s", path, os.strerror(err))
            continue
        files.add(path)
    for path in sorted(files):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:  # replaced or removed since it was loaded: its pages stay cached
            log.debug("%s: %s", path, exc)
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError as exc:
            log.debug("posix_fadvise on %s: %s", path, exc)
        finally:
            os.close(fd)
    after = rss_bytes()
    freed = max(0, before - after)
    log.info("handed back %.1f MB of library pages loading read (%d files; resident %.1f MB)",
             freed / 1048576, len(files), after / 1048576)
    return freed
