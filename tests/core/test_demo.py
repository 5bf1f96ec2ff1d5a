"""The README's first command: the demo end to end (package, verify, install, run, serve)."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_demo_end_to_end(cli, tmp_path):
    r = cli("demo", "--out-dir", str(tmp_path / "demo"), "--requests", "40", timeout=1200)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    assert "espresso" in out                      # the bundled model still classifies the coffee photo
    assert "minisign -V OK" in out                # stock minisign verified the manifest
    assert "40 / 4 / 0" in out                    # 40 requests through tritonclient, none failed
    assert "PASSED demo" in out
    store = tmp_path / "demo" / "store" / "bundles" / "efficientnet-lite0"
    assert (store / "current").is_symlink() and (store / "current" / "manifest.json").exists()
