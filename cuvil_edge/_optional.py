"""Optional dependencies imported where used, through one helper (Polygraphy ``mod.lazy_import``).

``import cuvil_edge`` and every ``--help`` work on an x86 laptop without TensorRT, pycuda, CuPy,
jetson-stats or tritonclient; the code that needs one imports it at the point of use with
:func:`optional_import`, which turns the ImportError into the package's error for that place, naming
what is missing, what needs it and what to install. Hard dependencies (numpy, onnx, onnxruntime,
grpcio, ...) and the package's own modules are imported plainly: a guard there only hides a broken
install.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from cuvil_edge.errors import CuvilEdgeError

__all__ = ["optional_import"]


def optional_import(module: str, *, needed_for: str, install: str,
                    error: type[CuvilEdgeError] = CuvilEdgeError) -> ModuleType:
    """Import ``module`` or raise ``error`` saying what needs it and how to install it.

    Args:
        module (str): the dotted module name (``"pycuda.driver"``).
        needed_for (str): what needs it, for the message (``"the TensorRT backend"``).
        install (str): how to get it (``"pip install 'cuvil-edge[jetson]'"``).
        error (type[CuvilEdgeError]): the error to raise. Defaults to CuvilEdgeError.

    Raises:
        CuvilEdgeError: of class ``error``, chained to the ImportError.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise error(f"{needed_for} needs {module} ({exc}); {install}") from exc
