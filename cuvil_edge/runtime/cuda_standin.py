"""STAND-IN for CUDA's initialisation on a Jetson (L4T 36), for boards without a GPU. NOT CUDA.

``cuInit`` on an Orin under JetPack 6 opens the integrated GPU's device nodes: the memory manager
``/dev/nvmap``, the nvgpu control and power nodes ``/dev/nvgpu/igpu0/ctrl`` and ``power``, the
sync-point fence node ``/dev/host1x-fence`` and the DRM render node ``/dev/dri/renderD128``
(Canonical's Tegra CUDA interface, snapd ``interfaces/builtin/nvidia_tegra_drivers_support.go``,
grants exactly these; a public CUDA trace on Orin opens them). When one open is refused -
systemd's device cgroup (``DevicePolicy=closed`` without a ``DeviceAllow=`` for it), a missing
``render`` group, file modes - CUDA reports no device and every engine falls back to the CPU.

:func:`cuda_init` does those opens, in that order, and fails as CUDA would
(``cudaErrorNoDevice``, naming the node and the errno), so the engine stand-in
(:class:`~cuvil_edge.runtime.trt_standin.TrtStandinBackend`) exercises the daemon's sandbox for
real on the emulated L4T board, whose stand-in nodes are real character devices. A machine that
shows none of these nodes is not a Jetson: there the stand-in does nothing (returns an empty list)
and says so, so loopback tests on a workstation still run the engine path.
"""

from __future__ import annotations

import errno
import logging
import os

from cuvil_edge.errors import DaemonError

__all__ = ["L4T36_CUDA_NODES", "CudaInitError", "cuda_init"]

log = logging.getLogger("cuvil_edge.runtime.cuda_standin")

# The nodes CUDA opens on L4T 36 (Orin), in the order it opens them. The daemon's unit must allow
# every one (a test checks cuvil_edge/daemon/units/cuvil-edged.service against this list).
L4T36_CUDA_NODES = ("/dev/nvmap", "/dev/nvgpu/igpu0/ctrl", "/dev/nvgpu/igpu0/power", "/dev/host1x-fence",
                    "/dev/dri/renderD128")


class CudaInitError(DaemonError):
    """CUDA could not initialise (the stand-in's ``cudaErrorNoDevice``)."""


def cuda_init(dev_root: str = "/") -> list[str]:
    """Open (and close) every node CUDA opens on L4T 36; the nodes opened.

    Args:
        dev_root (str): the system root the nodes are under. Defaults to ``/``.

    Returns:
        list[str]: the nodes opened; empty when the machine shows no Tegra GPU node at all.

    Raises:
        CudaInitError: a node exists on this Jetson but cannot be opened read-write, or one of the
            nodes is missing while others exist (CUDA fails the same way).
    """
    paths = [os.path.join(dev_root, p.lstrip("/")) for p in L4T36_CUDA_NODES]
    if not any(os.path.lexists(p) for p in paths):
        log.info("CUDA-init STAND-IN: no Tegra GPU node here (%s); not a Jetson, nothing opened",
                 L4T36_CUDA_NODES[0])
        return []
    opened = []
    for node, path in zip(L4T36_CUDA_NODES, paths, strict=True):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOCTTY)
        except OSError as exc:
            name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            raise CudaInitError(f"cudaErrorNoDevice: CUDA-init STAND-IN could not open {node} ({name}: "
                                f"{exc.strerror}); under systemd the unit needs DeviceAllow={node} rw and the "
                                "video and render groups") from None
        os.close(fd)
        opened.append(node)
    log.info("CUDA-init STAND-IN opened %s", " ".join(opened))
    return opened
