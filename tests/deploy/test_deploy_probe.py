"""Device facts parsing and the bundle/device fit rules (no devices needed)."""

from __future__ import annotations

import pytest

from cuvil_edge.bundle import Manifest
from cuvil_edge.deploy.layout import check_component
from cuvil_edge.deploy.probe import (
    DeviceFacts,
    IncompatibleDevice,
    check_compatible,
    parse_dpkg_status,
    parse_nv_tegra_release,
    profile_from_model,
)
from cuvil_edge.deploy.transport import parse_address
from cuvil_edge.errors import DeployError


def _manifest(target: str, fmt: str, releases=None, build_plans=None) -> Manifest:
    from cuvil_edge.targets import get_target

    t = get_target(target)
    return Manifest.from_dict({
        "format": "cuvil-bundle/1", "name": "m", "version": "1", "precision": "fp16", "format_kind": fmt,
        "target": {"name": t.name, "arch": t.arch, "gpu_sm": t.gpu_sm,
                   "releases": releases if releases is not None else [r.__dict__ for r in t.releases]},
        "model": "model.onnx", "inputs": [], "outputs": [],
        "files": [{"path": "model.onnx", "sha256": "0" * 64, "size": 1}],
        "build_plans": build_plans or [],
    })


class TestParsers:
    def test_nv_tegra_release(self):
        line = "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, DATE: x\n"
        assert parse_nv_tegra_release(line) == "36.4.3"
        assert parse_nv_tegra_release("# R35 (release), REVISION: 5.0, GCID: 1") == "35.5.0"
        assert parse_nv_tegra_release("garbage") is None

    def test_dpkg_status(self):
        text = ("Package: libnvinfer10\nStatus: install ok installed\nVersion: 10.3.0.30-1+cuda12.5\n\n"
                "Package: tensorrt\nStatus: deinstall ok config-files\nVersion: 8.6.2.3-1+cuda12.2\n")
        assert parse_dpkg_status(text) == "10.3.0"
        assert parse_dpkg_status("Package: bash\nStatus: install ok installed\nVersion: 5.2\n") is None

    @pytest.mark.parametrize("model,ram,want", [
        ("NVIDIA Jetson Orin Nano Developer Kit", 7600, "orin-nano-8gb"),
        ("NVIDIA Jetson Orin Nano Developer Kit", 3500, "orin-nano-4gb"),
        ("NVIDIA Jetson AGX Orin Developer Kit", 62000, "agx-orin-64gb"),
        ("NVIDIA Jetson Xavier NX Developer Kit", 7600, "xavier-nx"),
        (None, None, "x86-host"),
    ])
    def test_profile(self, model, ram, want):
        assert profile_from_model(model, "x86_64" if model is None else "aarch64", ram) == want

    def test_address(self):
        a = parse_address("admin@10.0.0.7:2222", root="/mnt/r")
        assert (a.user, a.host, a.port, a.root, a.store_root) == ("admin", "10.0.0.7", 2222, "/mnt/r",
                                                                   "/mnt/r/var/lib/cuvil-edge")
        b = parse_address("[fe80::1]:2200")
        assert (b.host, b.port) == ("fe80::1", 2200)
        with pytest.raises(DeployError):
            parse_address("host:notaport")

    @pytest.mark.parametrize("bad", ["..", "current", "a/b", "", ".hidden", "x.part"])
    def test_unsafe_names(self, bad):
        with pytest.raises(DeployError):
            check_component("version", bad)


class TestCompatible:
    orin = DeviceFacts(arch="aarch64", model="Orin Nano", profile="orin-nano-8gb", l4t="36.4.3", tensorrt="10.3.0")

    def test_cpu_bundle_on_any_board_of_its_arch(self):
        notes = check_compatible(_manifest("generic-arm64", "ort-cpu"), self.orin)
        assert notes and "generic-arm64" in notes[0]
        with pytest.raises(IncompatibleDevice, match="x86_64"):
            check_compatible(_manifest("x86-host", "ort-cpu"), self.orin)

    def test_tensorrt_release_and_sm(self):
        check_compatible(_manifest("orin-nx-16gb", "tensorrt"), self.orin)  # same SM 8.7: allowed
        with pytest.raises(IncompatibleDevice, match="SM 7.2"):
            check_compatible(_manifest("agx-xavier", "tensorrt"), self.orin)
        only_jp5 = [{"jetpack": "5.1.3", "l4t": "35.5.0", "tensorrt": "8.5.2", "cuda": "11.4"}]
        with pytest.raises(IncompatibleDevice, match="TensorRT 10.3.0"):
            check_compatible(_manifest("orin-nano-8gb", "tensorrt", only_jp5), self.orin)
        plan = [{"tensorrt": "10.3.0", "path": "engine/plan-trt10.3.0.json"}]
        check_compatible(_manifest("orin-nano-8gb", "tensorrt", only_jp5, plan), self.orin)
        no_trt = DeviceFacts(arch="aarch64", profile="orin-nano-8gb", l4t="36.4.3")
        with pytest.raises(IncompatibleDevice, match="install JetPack"):
            check_compatible(_manifest("orin-nano-8gb", "tensorrt"), no_trt)


    def test_a_malformed_target_is_one_error_naming_the_field(self):
        from cuvil_edge.errors import BundleError

        bad = _manifest("orin-nano-8gb", "tensorrt", [{"l4t": "36.4.3"}])
        with pytest.raises(BundleError, match=r"target\.releases\[0\]"):
            check_compatible(bad, self.orin)
        bad.target["releases"] = "36.4.3"
        with pytest.raises(BundleError, match=r"'target\.releases' must be a list"):
            check_compatible(bad, self.orin)
        bad.target.update(releases=[], gpu_sm=["8.7"])
        with pytest.raises(BundleError, match=r"'target\.gpu_sm' must be a string"):
            check_compatible(bad, self.orin)

    def test_the_typed_target(self):
        board = _manifest("orin-nano-8gb", "tensorrt").board
        assert (board.name, board.arch, board.gpu_sm) == ("orin-nano-8gb", "aarch64", "8.7")
        assert ("36.4.3", "10.3.0") in [(r.l4t, r.tensorrt) for r in board.releases]


class TestPackageOnly:
    def test_jetpack5_is_refused_with_one_line(self):
        from cuvil_edge.deploy.probe import PackageOnlyDevice, refuse_package_only

        jp5 = DeviceFacts(arch="aarch64", profile="orin-nano-8gb", l4t="35.5.0", tensorrt="8.5.2")
        with pytest.raises(PackageOnlyDevice) as err:
            refuse_package_only(jp5, "nano-1")
        msg = str(err.value)
        assert "\n" not in msg and msg.startswith("nano-1: L4T 35.5.0 is JetPack 5")
        assert "Python 3.8" in msg and "package-only" in msg and "trtexec" in msg
        refuse_package_only(TestCompatible.orin)  # JetPack 6: fine
        refuse_package_only(DeviceFacts(arch="aarch64"))  # no L4T (a plain arm64 board): fine

    def test_targets_say_which_releases_are_package_only(self):
        from cuvil_edge.targets import get_target

        releases = {r.jetpack: r for r in get_target("orin-nano-8gb").releases}
        assert releases["5.1.3"].package_only and releases["5.1.3"].python == "3.8"
        assert not releases["6.0"].package_only and not releases["6.2"].package_only
