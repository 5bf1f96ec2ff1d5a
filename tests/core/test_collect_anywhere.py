"""The suite collects where the native kernel library is not built (a fresh checkout, a CI lint job).

``CUVIL_SVE_LIBRARY`` naming a missing file makes every load of the library fail exactly as on a
machine without ``cross/build.sh host``; collection must still succeed (the kernel tests build the
library in a fixture when they run, and skip ISAs the CPU lacks).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_collect_only_without_the_kernel_library(tmp_path):
    env = {**os.environ, "CUVIL_SVE_LIBRARY": str(tmp_path / "not-built" / "libcuvil_sve.so")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           str(REPO / "tests")], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "error" not in proc.stdout.splitlines()[-1], proc.stdout.splitlines()[-1]
