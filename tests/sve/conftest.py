"""Fixtures for the kernel tests: the built libraries (cross/build.sh is idempotent)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _build(arch: str) -> Path:
    proc = subprocess.run([str(REPO / "cross" / "build.sh"), arch], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"cross/build.sh {arch} failed:\n{proc.stdout}\n{proc.stderr}"
    return REPO / "build" / arch


@pytest.fixture(scope="session")
def host_build() -> Path:
    """build/host with libcuvil_sve.so and cuvil_sve_selftest."""
    return _build("host")


@pytest.fixture(scope="session")
def aarch64_build() -> Path:
    """build/aarch64 with libcuvil_sve.so and cuvil_sve_selftest."""
    return _build("aarch64")
