"""Memory a process pays once when CUDA and TensorRT start: the context and the libraries' device code.

TensorRT's developer guide ("How TensorRT Works", Memory) says the CUDA infrastructure and
TensorRT's device code take memory that "varies by platform, device, and TensorRT version", before
any engine's weights or activations. On a Jetson that memory is the same LPDDR the CPU uses, so
the co-scheduler must count it, once per process, or it plans a budget the first engine already
overruns. No Jetson is reachable to measure it, so the figures are public measurements, by
whether CUDA loads modules lazily (CUDA >= 11.7 with ``CUDA_MODULE_LOADING=LAZY``, the default
on Linux from CUDA 12.2: CUDA C++ Programming Guide, "Lazy Loading"):

* eager module loading (JetPack 5: CUDA 11.4, TensorRT 8.5): 666,632,192 bytes for a CUDA
  context with cuDNN/cuBLAS loaded (pytorch/pytorch#86509, measured without lazy loading); NVIDIA
  gives "around 600 MiB" for loading TensorRT, cuDNN and cuBLAS on a Jetson
  (forums.developer.nvidia.com/t/why-tensorrt-occupy-many-memory/56741);
* lazy module loading (JetPack 6: CUDA 12.2/12.6, TensorRT 8.6 and 10.x; JetPack 7): 287,047,680
  bytes, the same measurement with lazy loading (pytorch/pytorch#86509).

The CUDA version of a TensorRT version comes from the JetPack table in ``data/targets.toml``.
"""

from __future__ import annotations

__all__ = ["EAGER_STARTUP_BYTES", "LAZY_STARTUP_BYTES", "cuda_startup_bytes", "lazy_loading_default"]

EAGER_STARTUP_BYTES = 666_632_192  # pytorch/pytorch#86509, CUDA_MODULE_LOADING unset (eager)
LAZY_STARTUP_BYTES = 287_047_680  # the same, CUDA_MODULE_LOADING=LAZY


def lazy_loading_default(cuda: str) -> bool:
    """Whether CUDA ``cuda`` loads modules lazily by default (12.2 and later, on Linux)."""
    from cuvil_edge.bundle.engine_key import major_minor

    return major_minor(cuda) >= (12, 2)


def cuda_startup_bytes(tensorrt: str) -> int:
    """Memory the CUDA context and TensorRT's libraries take at start-up, for a TensorRT version.

    The CUDA version is the one JetPack pairs with that TensorRT (major.minor); a TensorRT no
    JetPack release names gets the eager (larger) figure, the safe side for a memory budget.

    Args:
        tensorrt (str): TensorRT version, e.g. ``"10.3.0"``.
    """
    from cuvil_edge.bundle.engine_key import major_minor
    from cuvil_edge.targets import all_targets

    for target in all_targets().values():
        for release in target.releases:
            if major_minor(release.tensorrt) == major_minor(tensorrt):
                return LAZY_STARTUP_BYTES if lazy_loading_default(release.cuda) else EAGER_STARTUP_BYTES
    return EAGER_STARTUP_BYTES
