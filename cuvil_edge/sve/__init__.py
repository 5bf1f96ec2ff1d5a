"""Native CPU kernels for pre- and post-processing (``libcuvil_sve``: scalar, NEON, SVE, SVE2).

Each op is numpy in, numpy out, with an optional preallocated output; arguments are checked
in Python (errors raise :class:`cuvil_edge.errors.KernelError`) and the C call releases the GIL,
so several threads can run kernels at once. The ISA is chosen per op when the library loads
(``CUVIL_FORCE_ISA=scalar|neon|sve|sve2`` overrides it and refuses one the CPU lacks);
:func:`cpu_info` reports the choice and the SVE vector length.

The library comes from the package (``cross/build.sh host``) on a workstation, and on a device
from a bundle's ``plugins/linux-aarch64/`` (``load_library(bundle_dir)`` or ``CUVIL_SVE_LIBRARY``).

Example::

    from cuvil_edge import sve
    x = sve.resize_normalize(frame_bgr, (640, 640), mean=0, std=255, swap_rb=True, letterbox=True)
    det = sve.nms(out[0, :4].T, out[0, 4:].T, score_threshold=0.25, iou_threshold=0.45)
"""

from __future__ import annotations

from cuvil_edge.sve._library import LIBRARY_NAME, PLATFORMS, current_platform, library_for, load_library
from cuvil_edge.sve._ops import (
    ISAS,
    OPS,
    Detections,
    Letterbox,
    cpu_info,
    dequantize,
    letterbox_rect,
    nms,
    normalize,
    quantize,
    resize_normalize,
    select_isa,
    set_num_threads,
    softmax,
    softmax_topk,
)

__all__ = [
    "ISAS",
    "LIBRARY_NAME",
    "OPS",
    "PLATFORMS",
    "Detections",
    "Letterbox",
    "cpu_info",
    "current_platform",
    "dequantize",
    "letterbox_rect",
    "library_for",
    "load_library",
    "nms",
    "normalize",
    "quantize",
    "resize_normalize",
    "select_isa",
    "set_num_threads",
    "softmax",
    "softmax_topk",
]
