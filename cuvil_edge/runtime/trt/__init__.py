"""TensorRT backend: runs a bundle's engine on a Jetson (or any NVIDIA GPU with TensorRT >= 8.5).

Written against the documented TensorRT Python API; TensorRT cannot be installed on the
development machine, so the parts that need it are thin and the rest is plain Python, tested.
One module per job:

* :mod:`.tensorrt_import`: importing TensorRT and pycuda (optional, ``cuvil-edge[jetson]``) and
  TensorRT's installed version; :class:`TensorRTMissing` says what to install.
* :mod:`.engine_choice`: the manifest ``engines`` entry built for this device
  (:func:`select_engine`, :func:`local_l4t`). The daemon itself serves engines from the device's
  engine store, outside the signed bundle (:mod:`cuvil_edge.runtime.trt_select`).
* :mod:`.device_memory`: the few device-memory operations the backend needs (:class:`DeviceOps`),
  with pycuda (:class:`PyCudaOps`); what lets the tests check placement and copy traffic without
  a GPU.
* :mod:`.scratch`: activation memory shared by every model's execution contexts
  (:class:`ScratchArena`, :func:`shared_arena`, :func:`trim_shared_arena`).
* :mod:`.io_buffers`: I/O placement (:func:`choose_placement`: mapped zero-copy on an integrated
  GPU, pinned with device twins on a discrete one) and the buffers of one execution context
  (:class:`IOSlot`, :class:`TensorBinding`, :func:`pad_batch`).
* :mod:`.backend`: :class:`TrtBackend` and one inference on one context (:func:`run_slot`).

Every name below was importable from ``cuvil_edge.runtime.trt`` when it was one module, and
still is.
"""

from __future__ import annotations

from cuvil_edge.runtime.trt.backend import TrtBackend, run_slot
from cuvil_edge.runtime.trt.device_memory import DeviceOps, PyCudaOps
from cuvil_edge.runtime.trt.engine_choice import local_l4t, select_engine
from cuvil_edge.runtime.trt.io_buffers import IOSlot, TensorBinding, choose_placement, pad_batch
from cuvil_edge.runtime.trt.scratch import ScratchArena, shared_arena, trim_shared_arena
from cuvil_edge.runtime.trt.tensorrt_import import (
    TensorRTMissing,
    import_tensorrt,
    installed_tensorrt_version,
)

__all__ = [
    "DeviceOps",
    "IOSlot",
    "PyCudaOps",
    "ScratchArena",
    "TensorBinding",
    "TensorRTMissing",
    "TrtBackend",
    "choose_placement",
    "import_tensorrt",
    "installed_tensorrt_version",
    "local_l4t",
    "pad_batch",
    "run_slot",
    "select_engine",
    "shared_arena",
    "trim_shared_arena",
]
