"""TOML loading that works on Python 3.10 (JetPack 6) and later."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 devices
    import tomli as tomllib

__all__ = ["TOMLDecodeError", "load_toml", "loads_toml"]

TOMLDecodeError = tomllib.TOMLDecodeError


def loads_toml(text: str) -> dict[str, Any]:
    """Parse TOML text."""
    return tomllib.loads(text)


def load_toml(path: Path) -> dict[str, Any]:
    """Read and parse a TOML file."""
    with open(path, "rb") as f:
        return tomllib.load(f)
