"""The runtime's one door for a bundle manifest: everything past it reads a typed :class:`Manifest`.

The runtime reads a handful of manifest fields (model file, name and version for labels,
``format_kind``, ``precision``, ``engines``, ``files``, ``inputs``/``outputs``). It reads them from
:class:`~cuvil_edge.bundle.manifest.Manifest`, the bundle's own parser, so a field renamed there
is renamed here too.

The daemon passes the typed manifest its store read. A dict (library callers, scripts) goes
through :meth:`Manifest.from_dict`; when that refuses it (a manifest written by hand without
``files`` or ``target``), the fields the runtime reads are taken as they are, with the defaults
the runtime always applied, so such a dict still loads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cuvil_edge.bundle.manifest import FileEntry, Manifest
from cuvil_edge.errors import BundleError

__all__ = ["ManifestLike", "as_manifest"]

ManifestLike = Manifest | Mapping[str, Any]


def as_manifest(manifest: ManifestLike) -> Manifest:
    """``manifest`` as a :class:`Manifest`: itself, parsed by the bundle module, or read as the runtime always read it.

    Args:
        manifest (Manifest | Mapping[str, Any]): a parsed manifest, or its dict form
            (``manifest.json``, docs/bundle-format.md).
    """
    if isinstance(manifest, Manifest):
        return manifest
    data = dict(manifest)
    try:
        return Manifest.from_dict(data)
    except BundleError:
        return _as_read_before(data)


def _as_read_before(data: dict[str, Any]) -> Manifest:
    """The fields the runtime reads, with the defaults it applied to a manifest dict before it was typed."""

    def text(key: str, default: str = "") -> str:
        value = data.get(key)
        return default if value is None else str(value)

    def listed(key: str) -> list[Any]:
        value = data.get(key)
        return list(value) if isinstance(value, list) else []

    files = []
    for entry in listed("files"):
        if isinstance(entry, Mapping) and isinstance(entry.get("path"), str) and isinstance(entry.get("sha256"), str):
            size = entry.get("size")
            files.append(FileEntry(entry["path"], entry["sha256"], size if isinstance(size, int) else 0))
    max_batch = data.get("max_batch")
    target = data.get("target")
    return Manifest(
        name=text("name"),
        version=text("version"),
        target=dict(target) if isinstance(target, Mapping) else {},
        precision=text("precision"),
        format_kind=text("format_kind"),
        model=text("model") or "model.onnx",
        inputs=listed("inputs"),
        outputs=listed("outputs"),
        files=files,
        max_batch=max_batch if isinstance(max_batch, int) and not isinstance(max_batch, bool) else 1,
        engines=[dict(e) for e in listed("engines") if isinstance(e, Mapping)],
        raw=data,
    )
