"""Put the code under test on a board: a wheel of the working tree, installed with pip.

The board image holds only third-party packages; the project itself travels at run time, so a
code change costs a wheel build (seconds) and never an image rebuild. The wheel carries the
cross-built ``libcuvil_sve.so`` for linux-aarch64 (``cross/build.sh aarch64``), which is how a
user's board gets the kernels too.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from hil.errors import HilError

if TYPE_CHECKING:
    from hil.board import Board

__all__ = ["REPO", "build_wheel", "install_project"]

REPO = Path(__file__).resolve().parent.parent


def build_wheel(out_dir: Path, repo: Path = REPO) -> Path:
    """Builds a wheel of ``repo`` (after building the aarch64 kernels) into ``out_dir``.

    The tree is copied first (package, pyproject, README), so the build leaves nothing in the
    working tree.
    """
    cross = repo / "cross" / "build.sh"
    if cross.is_file():
        res = subprocess.run([str(cross), "aarch64"], capture_output=True, text=True, timeout=900)
        if res.returncode != 0:
            raise HilError(f"cross/build.sh aarch64 failed ({res.returncode}): {res.stderr.strip()[-800:]}")
    lib = repo / "cuvil_edge" / "sve" / "_lib" / "linux-aarch64" / "libcuvil_sve.so"
    if not lib.is_file():
        raise HilError(f"{lib} missing: run cross/build.sh aarch64")
    with tempfile.TemporaryDirectory(prefix="cuvil-hil-wheel-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        shutil.copytree(repo / "cuvil_edge", src / "cuvil_edge",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            if (repo / name).is_file():
                shutil.copy2(repo / name, src / name)
        out_dir.mkdir(parents=True, exist_ok=True)
        base = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out_dir), str(src)]
        # The environment's own setuptools first (offline, fast); pip's isolated build (fetches the
        # build-system requirements) when that one is too old for pyproject.toml.
        res = subprocess.run([*base, "--no-build-isolation"], capture_output=True, text=True, timeout=600)
        if res.returncode != 0:
            res = subprocess.run(base, capture_output=True, text=True, timeout=600)
        if res.returncode != 0:
            raise HilError(f"pip wheel of {repo} failed: {res.stderr.strip()[-800:]}")
    wheels = sorted(out_dir.glob("cuvil_edge-*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        raise HilError(f"pip wheel wrote no cuvil_edge wheel into {out_dir}")
    return wheels[-1]


def install_project(board: Board, wheel: Path | None = None) -> str:
    """Installs the project on the board (``pip install --no-deps``); returns its version.

    Args:
        board (Board): the board.
        wheel (Path | None): a wheel to install. Defaults to a fresh wheel of this tree.
    """
    with tempfile.TemporaryDirectory(prefix="cuvil-hil-wheel-") as tmp:
        whl = wheel or build_wheel(Path(tmp))
        remote = f"/tmp/{whl.name}"
        board.put(whl, remote)
        board.ssh(["python3", "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile",
                   "--force-reinstall", "--break-system-packages", "--root-user-action=ignore", remote],
                  timeout=600)
        board.ssh(["rm", "-f", remote])
    out = board.ssh(["python3", "-c", "import cuvil_edge, sys; sys.stdout.write(cuvil_edge.__version__)"],
                    check=False, timeout=300)
    return out.stdout.strip() or "unknown"
