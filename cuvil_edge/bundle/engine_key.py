"""Version helpers of the engine key, shared by the host's packager and the board's runtime.

An engine is only valid for the (L4T, TensorRT, GPU SM, DLA core) it was built with; its key is
written in the bundle's build plans and in the engine store on the board (see
``docs/bundle-format.md``). Host and board must read TensorRT and L4T versions the same way, so the
parsing lives here, in the bundle contract, below both the packager and the runtime: the runtime
no longer imports the packager to compare a plan's TensorRT version with the one it runs.

The :class:`~cuvil_edge.packager.engine.EngineKey` class itself still lives in
``packager/engine.py``; moving it here is a follow-up once that module's split has landed.
"""

from __future__ import annotations

__all__ = ["major_minor", "version_tuple"]


def version_tuple(version: str) -> tuple[int, ...]:
    """The numeric parts of a version string: ``"10.3.0.30"`` -> ``(10, 3, 0, 30)``.

    A part without digits counts as 0 and letters inside a part are dropped (``"8.6.2-rc1"`` ->
    ``(8, 6, 21)``), so any version a board reports compares without raising.

    Args:
        version (str): a TensorRT, L4T or CUDA version.
    """
    parts = []
    for piece in str(version).split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def major_minor(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a version: engines and parser tables match on these two only.

    Args:
        version (str): a TensorRT or L4T version; missing parts count as 0 (``"10"`` -> ``(10, 0)``).
    """
    v = version_tuple(version) + (0, 0)
    return v[0], v[1]
