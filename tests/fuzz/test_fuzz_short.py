"""A short run of every fuzz target: the suite keeps them working; the long run is in docs/hardening.md.

Each target runs as libFuzzer runs it (a subprocess, coverage-guided by atheris) from its seed
corpus for a few thousand executions; a crash fails the test with libFuzzer's report.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("atheris", reason="atheris is in the dev extra: pip install -e .[dev]")

HERE = Path(__file__).resolve().parent
TARGETS = ["kserve_request", "http_protocol", "tegrastats", "bundle", "recipe", "state_file", "grpc_message"]


@pytest.mark.parametrize("target", TARGETS)
def test_short_fuzz_run_finds_nothing(target, tmp_path):
    corpus = tmp_path / "corpus"
    proc = subprocess.run(
        [sys.executable, str(HERE / f"fuzz_{target}.py"), str(corpus), "-runs=1000", "-max_total_time=8",
         "-seed=13", "-max_len=8192", "-rss_limit_mb=2048", f"-artifact_prefix={tmp_path}/"],
        cwd=tmp_path, capture_output=True, text=True, timeout=180)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report[-4000:]
    assert re.search(r"Done \d+ runs", report), report[-2000:]
    assert not list(tmp_path.glob("crash-*")), report[-4000:]
    assert len(list(corpus.iterdir())) >= 2  # the seeds, and whatever new coverage the run kept
