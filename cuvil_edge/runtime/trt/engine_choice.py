"""Choosing, among the engines a bundle's manifest lists, the one built for this device.

The daemon serves engines from the device's engine store, outside the signed bundle
(:mod:`cuvil_edge.runtime.trt_select`); :func:`select_engine` serves bundles that carry engines
themselves (:meth:`~cuvil_edge.runtime.trt.TrtBackend.from_bundle`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cuvil_edge.bundle.engine_key import major_minor

__all__ = ["local_l4t", "select_engine"]


def local_l4t(root: Path = Path("/")) -> str | None:
    """L4T release from ``<root>/etc/nv_tegra_release`` (``# R36 (release), REVISION: 4.3``)."""
    try:
        text = (Path(root) / "etc/nv_tegra_release").read_text("utf-8", "replace")
    except OSError:
        return None
    m = re.search(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", text)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def select_engine(
    engines: Sequence[Mapping[str, Any]],
    tensorrt: str,
    l4t: str | None = None,
    sm: str | None = None,
    dla_core: int | None = None,
) -> Mapping[str, Any] | None:
    """The manifest ``engines`` entry built for this device, or None.

    An engine loads only under the TensorRT version that built it (major.minor must match;
    the patch level is tolerated), on the same SM, for the same DLA core. L4T and SM are
    compared when known. Among matches, an exact TensorRT version and L4T win.
    """
    best: tuple[int, Mapping[str, Any]] | None = None
    for entry in engines:
        key = entry.get("key") or {}
        if major_minor(str(key.get("tensorrt", "0"))) != major_minor(tensorrt):
            continue
        if key.get("dla_core") != dla_core:
            continue
        if sm is not None and str(key.get("sm")) != str(sm):
            continue
        score = (2 if str(key.get("tensorrt")) == tensorrt else 0) + (1 if l4t and str(key.get("l4t")) == l4t else 0)
        if best is None or score > best[0]:
            best = (score, entry)
    return best[1] if best else None
