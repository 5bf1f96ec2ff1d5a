"""Inference backends behind one protocol (:class:`Backend`): ONNX Runtime and TensorRT.

:func:`load_backend` picks one for a bundle: TensorRT when the manifest's ``format_kind`` is
``tensorrt``, the bundle carries an engine (or the caller asks for it) and ``tensorrt`` imports;
ONNX Runtime otherwise. Backend modules import lazily, so this package imports anywhere.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from cuvil_edge.bundle.manifest import Manifest
from cuvil_edge.errors import DaemonError
from cuvil_edge.runtime._manifest import ManifestLike, as_manifest
from cuvil_edge.runtime.base import (
    Backend,
    BackendOptions,
    Footprint,
    TensorSpec,
    datatype_of,
    dtype_of,
)

__all__ = [
    "BACKENDS",
    "Backend",
    "BackendOptions",
    "Footprint",
    "TensorSpec",
    "backend_class",
    "datatype_of",
    "dtype_of",
    "load_backend",
]

# kind -> "module:Class", imported on first use.
BACKENDS: dict[str, str] = {
    "ort": "cuvil_edge.runtime.ort:OrtBackend",
    "tensorrt": "cuvil_edge.runtime.trt:TrtBackend",
}


def backend_class(kind: str) -> type[Backend]:
    """The backend class for ``kind`` (``"ort"``, ``"tensorrt"``), imported on first use.

    Raises:
        DaemonError: unknown kind, or its module is missing.
    """
    try:
        target = BACKENDS[kind]
    except KeyError as exc:
        raise DaemonError(f"unknown backend {kind!r}: use one of {sorted(BACKENDS)}") from exc
    module_name, _, cls_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise DaemonError(f"backend {kind!r} is not available here: {exc}") from exc
    return getattr(module, cls_name)


def _wants_tensorrt(bundle_dir: Path, manifest: Manifest) -> bool:
    if manifest.format_kind != "tensorrt":
        return False
    return any((Path(bundle_dir) / str(e.get("path", ""))).is_file() for e in manifest.engines)


def load_backend(
    bundle_dir: Path,
    manifest: ManifestLike,
    options: BackendOptions | None = None,
    kind: str | None = None,
) -> Backend:
    """Construct (not activate) the backend for an extracted bundle.

    Args:
        bundle_dir (Path): the bundle directory.
        manifest (Manifest | Mapping[str, Any]): its manifest; the dict form (docs/bundle-format.md)
            is read through :class:`~cuvil_edge.bundle.manifest.Manifest`.
        options (BackendOptions | None): runtime options. Defaults to ``BackendOptions()``.
        kind (str | None): force a backend (``"ort"``/``"tensorrt"``). Defaults to TensorRT when
            the bundle is a TensorRT bundle with an engine present and TensorRT imports here,
            ONNX Runtime otherwise.

    Raises:
        DaemonError: a forced backend is not available here.
    """
    manifest = as_manifest(manifest)
    options = options or BackendOptions()
    if kind is None:
        kind = "ort"
        if options.device != "cpu" and _wants_tensorrt(bundle_dir, manifest):
            try:
                cls = backend_class("tensorrt")
                ok, _why = cls.available()
            except DaemonError:
                ok = False
            if ok:
                kind = "tensorrt"
    cls = backend_class(kind)
    ok, why = cls.available()
    if not ok:
        raise DaemonError(f"backend {kind!r} cannot run here: {why}")
    return cls.from_bundle(Path(bundle_dir), manifest, options)
