"""Finding and loading libcuvil_sve (ctypes), and the C signatures.

Search order for the library the toolkit uses:

1. an explicit path given to :func:`load_library` (a ``.so`` file, a directory holding one, or an
   extracted bundle directory, whose ``plugins/linux-<machine>/libcuvil_sve.so`` is used);
2. the ``CUVIL_SVE_LIBRARY`` environment variable (same forms);
3. the copy inside the package, ``cuvil_edge/sve/_lib/linux-<machine>/`` (``cross/build.sh host``);
4. the source tree's ``build/<arch>/`` (``cross/build.sh host|aarch64``).
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading
from pathlib import Path

from cuvil_edge.errors import KernelError

__all__ = ["LIBRARY_NAME", "PLATFORMS", "current_platform", "get_library", "library_for", "load_library"]

LIBRARY_NAME = "libcuvil_sve.so"
PLATFORMS = ("linux-aarch64", "linux-x86_64")
_ENV = "CUVIL_SVE_LIBRARY"
_PKG_DIR = Path(__file__).resolve().parent
_REPO_DIR = _PKG_DIR.parent.parent
_BUILD_ARCH = {"linux-aarch64": "aarch64", "linux-x86_64": "host"}

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_lib_path: Path | None = None


def current_platform() -> str:
    """Returns the plugin platform of this machine, e.g. ``"linux-x86_64"`` or ``"linux-aarch64"``."""
    machine = platform.machine().lower()
    machine = {"arm64": "aarch64", "amd64": "x86_64"}.get(machine, machine)
    return f"linux-{machine}"


def library_for(platform: str) -> Path:  # noqa: A002 - the packager's vocabulary
    """Returns the built ``libcuvil_sve.so`` for a plugin platform.

    The packager calls this to put the aarch64 library into bundles
    (``plugins/linux-aarch64/libcuvil_sve.so``).

    Args:
        platform (str): ``"linux-aarch64"`` or ``"linux-x86_64"``.

    Returns:
        pathlib.Path: the library file.

    Raises:
        KernelError: unknown platform, or the library is not built (the message names the command).
    """
    if platform not in PLATFORMS:
        raise KernelError(f"unknown kernel platform {platform!r}: use one of {', '.join(PLATFORMS)}")
    candidates = [_PKG_DIR / "_lib" / platform / LIBRARY_NAME]
    arch = "aarch64" if platform == "linux-aarch64" else "host"
    if platform == "linux-x86_64" or current_platform() == platform:
        candidates.append(_REPO_DIR / "build" / arch / LIBRARY_NAME)
    if platform == "linux-aarch64":
        candidates.append(_REPO_DIR / "build" / "aarch64" / LIBRARY_NAME)
    for c in candidates:
        if c.is_file():
            return c
    if platform == current_platform() or platform == "linux-aarch64":
        cmd = f"cross/build.sh {'aarch64' if platform == 'linux-aarch64' else 'host'}"
    else:
        cmd = "cross/build.sh host (on a linux-x86_64 machine)"
    raise KernelError(f"{LIBRARY_NAME} for {platform} is not built (looked in {candidates[0]}): run {cmd}")


def _resolve(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    if p.is_dir():
        for c in (p / "plugins" / current_platform() / LIBRARY_NAME, p / current_platform() / LIBRARY_NAME,
                  p / LIBRARY_NAME):
            if c.is_file():
                return c
        raise KernelError(f"no {LIBRARY_NAME} for {current_platform()} in {p} "
                          f"(expected plugins/{current_platform()}/{LIBRARY_NAME})")
    if not p.is_file():
        raise KernelError(f"kernel library {p} does not exist: build it with cross/build.sh or fix the path")
    return p


_c_size = ctypes.c_size_t
_c_ptr = ctypes.c_void_p
_c_int = ctypes.c_int
_c_float = ctypes.c_float
_c_diff = ctypes.c_ssize_t

_SIGNATURES = {
    "cuvil_abi_version": ([], _c_int),
    "cuvil_init_status": ([], _c_int),
    "cuvil_init_message": ([], ctypes.c_char_p),
    "cuvil_isa_for": ([_c_int], _c_int),
    "cuvil_isa_available": ([], ctypes.c_uint),
    "cuvil_sve_vector_bytes": ([], _c_size),
    "cuvil_select_isa": ([_c_int], _c_int),
    "cuvil_set_threads": ([_c_int], _c_int),
    "cuvil_get_threads": ([], _c_int),
    "cuvil_normalize": ([_c_ptr, _c_size, _c_size, _c_size, _c_int, _c_ptr, _c_ptr, _c_ptr, _c_int], _c_int),
    "cuvil_resize_normalize": (
        [_c_ptr, _c_size, _c_size, _c_size, _c_int, _c_ptr, _c_ptr, _c_ptr, _c_int, _c_size, _c_size,
         _c_size, _c_size, _c_size, _c_size, _c_ptr], _c_int),
    "cuvil_quantize": ([_c_ptr, _c_ptr, _c_size, _c_size, _c_size, _c_ptr], _c_int),
    "cuvil_dequantize": ([_c_ptr, _c_ptr, _c_size, _c_size, _c_size, _c_ptr], _c_int),
    "cuvil_softmax_topk": ([_c_ptr, _c_size, _c_size, _c_size, _c_ptr, _c_size, _c_ptr, _c_ptr], _c_int),
    "cuvil_nms": (
        [_c_ptr, _c_size, _c_diff, _c_diff, _c_int, _c_ptr, _c_size, _c_diff, _c_diff, _c_float, _c_float,
         _c_int, _c_size, _c_ptr, _c_ptr, _c_ptr, _c_ptr], ctypes.c_long),
}
ABI_VERSION = 1


def load_library(path: str | os.PathLike[str] | None = None) -> ctypes.CDLL:
    """Loads (or reloads) the kernel library the module-level functions use.

    Args:
        path (str | os.PathLike | None): a ``libcuvil_sve.so``, a directory holding one, or an extracted
            bundle directory (its ``plugins/linux-<machine>/``). Defaults to ``$CUVIL_SVE_LIBRARY``, then the
            package copy, then the source tree's build folder.

    Returns:
        ctypes.CDLL: the loaded library (calls through it release the GIL).

    Raises:
        KernelError: not found, not loadable, ABI mismatch, or ``CUVIL_FORCE_ISA`` rejected.
    """
    global _lib, _lib_path
    if path is None:
        path = os.environ.get(_ENV) or None
    resolved = _resolve(path) if path is not None else library_for(current_platform())
    try:
        lib = ctypes.CDLL(str(resolved))
    except OSError as exc:
        raise KernelError(f"cannot load kernel library {resolved}: {exc}") from exc
    for name, (args, res) in _SIGNATURES.items():
        fn = getattr(lib, name, None)
        if fn is None:
            raise KernelError(f"{resolved} lacks {name}: rebuild it with cross/build.sh")
        fn.argtypes = args
        fn.restype = res
    if lib.cuvil_abi_version() != ABI_VERSION:
        raise KernelError(f"{resolved} has ABI {lib.cuvil_abi_version()}, expected {ABI_VERSION}: rebuild it")
    if lib.cuvil_init_status() != 0:
        raise KernelError(f"{resolved}: {lib.cuvil_init_message().decode()}")
    with _lock:
        _lib, _lib_path = lib, resolved
    return lib


def get_library() -> tuple[ctypes.CDLL, Path]:
    """Returns the loaded library and its path, loading the default one on first use."""
    if _lib is None:
        load_library()
    assert _lib is not None and _lib_path is not None
    return _lib, _lib_path
