"""Fixtures shared by every test area: the CLI as a user runs it, keys, and real models."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 600) -> CliResult:
    """Run ``cuvil-edge`` in a fresh interpreter, exactly as the console script does."""
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "cuvil_edge.cli", *args],
        cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture(scope="session")
def cli():
    return run_cli


@pytest.fixture(scope="session")
def keypair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from cuvil_edge.bundle import generate_keypair

    d = tmp_path_factory.mktemp("keys")
    generate_keypair(d / "test.key", d / "test.pub")
    return d / "test.key", d / "test.pub"


@pytest.fixture(scope="session")
def other_keypair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from cuvil_edge.bundle import generate_keypair

    d = tmp_path_factory.mktemp("otherkeys")
    generate_keypair(d / "other.key", d / "other.pub")
    return d / "other.key", d / "other.pub"


@pytest.fixture(scope="session")
def digits_model() -> Path:
    from cuvil_edge.models import build_digits_cnn

    return build_digits_cnn()


@pytest.fixture(scope="session")
def effnet_model() -> Path:
    from cuvil_edge.models import build_efficientnet_lite0

    return build_efficientnet_lite0()
