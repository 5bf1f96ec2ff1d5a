"""The store layout's rules (``cuvil_edge/bundle/layout.py``) and the typed manifest of a served bundle."""

from __future__ import annotations

import json
import os

import pytest

from cuvil_edge.bundle.layout import StoreLayout, is_swap_link, point_current, read_current, remove_current
from cuvil_edge.bundle.manifest import Manifest
from cuvil_edge.daemon.store import BundleStore, read_manifest
from cuvil_edge.errors import BundleError, DeployError


def _version(root, name, version, manifest=None):
    d = root / "bundles" / name / version
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps(manifest or {"name": name, "version": version,
                                                             "inputs": [], "outputs": []}))
    return d


class TestLayout:
    def test_paths_are_posix_strings_under_the_root(self):
        lay = StoreLayout("/var/lib/cuvil-edge")
        assert lay.version_dir("digits", "1.0.0") == "/var/lib/cuvil-edge/bundles/digits/1.0.0"
        assert lay.manifest_path("digits", "1.0.0") == "/var/lib/cuvil-edge/bundles/digits/1.0.0/manifest.json"
        assert lay.staging_dir("digits", "1.0.0", pid=7) == "/var/lib/cuvil-edge/deploy/staging/digits-1.0.0.7"
        assert lay.state_lock_path == "/var/lib/cuvil-edge/deploy/state/.lock"
        assert lay.engines_dir == "/var/lib/cuvil-edge/engines"
        assert lay.state_names(["digits.json", ".lock", "digits.json.tmp-3", "..json", "x y.json"]) == ["digits"]

    @pytest.mark.parametrize("bad", ["..", "../etc", "current", "current.new", "previous", "a/b", "", "x.part"])
    def test_unsafe_names_raise_the_callers_error(self, bad):
        with pytest.raises(BundleError, match="not a safe directory name"):
            StoreLayout("/s").version_dir("digits", bad)
        with pytest.raises(DeployError, match="not a safe directory name"):
            StoreLayout("/s", DeployError).bundle_dir(bad)

    def test_swap_links_are_never_versions(self):
        lay = StoreLayout("/s")
        swap = os.path.basename(lay.swap_link("digits"))
        assert is_swap_link(swap) and is_swap_link("current.new") and not is_swap_link("1.0.0")
        assert swap != os.path.basename(lay.swap_link("digits"))  # fresh each time
        from cuvil_edge.bundle.names import is_safe_component

        assert not is_safe_component(swap)

    def test_point_current_switches_atomically_and_refuses_a_missing_version(self, tmp_path):
        lay = StoreLayout.of(tmp_path)
        _version(tmp_path, "digits", "1.0.0")
        _version(tmp_path, "digits", "1.1.0")
        assert read_current(lay, "digits") is None
        point_current(lay, "digits", "1.0.0")
        point_current(lay, "digits", "1.1.0")
        assert read_current(lay, "digits") == "1.1.0"
        assert os.readlink(tmp_path / "bundles/digits/current") == "1.1.0"
        with pytest.raises(FileNotFoundError, match="no such version"):
            point_current(lay, "digits", "9.9.9")
        assert read_current(lay, "digits") == "1.1.0"
        assert sorted(p.name for p in (tmp_path / "bundles/digits").iterdir()) == ["1.0.0", "1.1.0", "current"]
        remove_current(lay, "digits")
        assert read_current(lay, "digits") is None


    def test_a_switch_removes_swap_links_a_killed_switcher_left(self, tmp_path):
        """A switcher killed between link and rename leaves its swap link; the next switch removes
        it once its process is gone and it is a minute old, never a live or fresh one."""
        import subprocess
        import sys
        import time

        lay = StoreLayout.of(tmp_path)
        _version(tmp_path, "digits", "1.0.0")
        folder = tmp_path / "bundles/digits"
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True)
        dead_pid = int(gone.stdout)
        old = time.time() - 600

        def link(entry: str, age: float | None = old) -> None:
            os.symlink("1.0.0", folder / entry)
            if age is not None:
                os.utime(folder / entry, (age, age), follow_symlinks=False)

        link(f".current.{dead_pid}-0badcafe.tmp")  # killed switcher, old: removed
        link("current.new")  # an earlier release's, old: removed
        link(f".current.{os.getpid()}-1badcafe.tmp")  # a live process's: kept
        link(f".current.{dead_pid}-2badcafe.tmp", age=None)  # fresh: kept (another pid namespace?)
        point_current(lay, "digits", "1.0.0")
        left = sorted(p.name for p in folder.iterdir())
        assert left == sorted(["1.0.0", "current", f".current.{os.getpid()}-1badcafe.tmp",
                               f".current.{dead_pid}-2badcafe.tmp"]), left
        assert read_current(lay, "digits") == "1.0.0"


class TestServedManifest:
    def test_a_minimal_directory_bundle_still_serves(self, tmp_path):
        """What the daemon always accepted (name, version, inputs, outputs) loads typed, with the
        format's defaults; the complete parser (packing, signing, deploy) still refuses it."""
        d = _version(tmp_path, "digits", "1.0.0")
        m = read_manifest(d)
        assert (m.name, m.version, m.model, m.max_batch, m.precision) == ("digits", "1.0.0", "model.onnx", 1, "")
        assert not m.declared("max_batch")
        assert m.sample_member("sample_inputs") == "sample/inputs.npz"
        assert m.tolerances == (1e-3, 1e-2)
        assert m.latency_p95_ms is None
        with pytest.raises(BundleError, match="field 'format'"):
            Manifest.load(d)

    @pytest.mark.parametrize(("manifest", "message"), [
        ({"name": "digits", "version": "1.0.0", "outputs": []}, "missing field 'inputs'"),
        ({"name": "digits", "version": "1.0.0", "inputs": {}, "outputs": []}, "field 'inputs' has the wrong type"),
        ({"name": "digits", "version": "1.0.0", "inputs": [], "outputs": [], "precision": "fp8"}, "precision"),
        ({"name": "digits", "version": "1.0.0", "inputs": [], "outputs": [], "max_batch": "8"}, "max_batch"),
        ({"format": "other/1", "name": "digits", "version": "1.0.0", "inputs": [], "outputs": []}, "format"),
    ])
    def test_the_daemon_refuses_a_bad_manifest_naming_the_field(self, tmp_path, manifest, message):
        _version(tmp_path, "digits", "1.0.0", manifest)
        with pytest.raises(BundleError, match=message):
            BundleStore(tmp_path).manifest("digits")

    def test_a_missing_manifest_names_the_file(self, tmp_path):
        (tmp_path / "empty").mkdir()
        with pytest.raises(BundleError, match=r"empty/manifest.json: missing"):
            read_manifest(tmp_path / "empty")
