"""The board image is named by its own inputs only; the initramfs loads dependencies first."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from hil.images import IMAGE_INPUTS, STEPS, image_hash


class TestImageHash:
    def test_stable(self) -> None:
        assert image_hash() == image_hash()

    def test_changes_with_a_package_list_edit(self, tmp_path: Path) -> None:
        copy = tmp_path / "image"
        shutil.copytree(IMAGE_INPUTS, copy, ignore=shutil.ignore_patterns("__pycache__"))
        assert image_hash(copy) == image_hash()
        with open(copy / "packages.txt", "a") as f:
            f.write("htop\n")
        assert image_hash(copy) != image_hash()

    def test_project_code_is_not_an_input(self) -> None:
        inputs = {p.name for p in IMAGE_INPUTS.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
        assert inputs == {"build.sh", "packages.txt", "requirements-aarch64.txt", "initramfs.py"}

    def test_every_wheel_is_pinned(self) -> None:
        lines = [ln.strip() for ln in (IMAGE_INPUTS / "requirements-aarch64.txt").read_text().splitlines()
                 if ln.strip() and not ln.startswith("#")]
        assert lines and all("==" in ln for ln in lines)

    def test_build_announces_the_steps_progress_counts(self) -> None:
        steps = [ln for ln in (IMAGE_INPUTS / "build.sh").read_text().splitlines() if ln.startswith('echo "==> ')]
        assert len(steps) == STEPS + 1  # + "done"

    def test_stress_ng_is_on_the_board(self) -> None:
        assert "stress-ng" in (IMAGE_INPUTS / "packages.txt").read_text().split()


def _initramfs():  # the builder is a standalone script (runs with the host's python3)
    spec = importlib.util.spec_from_file_location("hil_initramfs", IMAGE_INPUTS / "initramfs.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class TestInitramfsModules:
    @pytest.fixture
    def mod_root(self, tmp_path: Path) -> Path:
        # modules.dep / modules.softdep / modules.builtin in depmod's format
        (tmp_path / "modules.dep").write_text(
            "kernel/fs/ext4/ext4.ko: kernel/fs/jbd2/jbd2.ko kernel/fs/mbcache.ko kernel/lib/crc16.ko\n"
            "kernel/fs/jbd2/jbd2.ko:\n"
            "kernel/fs/mbcache.ko:\n"
            "kernel/lib/crc16.ko:\n"
            "kernel/crypto/crc32c_generic.ko:\n"
            "kernel/drivers/block/virtio_blk.ko:\n"
            "kernel/drivers/net/virtio_net.ko: kernel/drivers/net/net_failover.ko kernel/net/core/failover.ko\n"
            "kernel/drivers/net/net_failover.ko: kernel/net/core/failover.ko\n"
            "kernel/net/core/failover.ko:\n"
            "kernel/drivers/char/hw_random/virtio-rng.ko:\n")
        (tmp_path / "modules.softdep").write_text("softdep ext4 pre: crc32c\nsoftdep crc32c pre: crc32c_generic\n")
        (tmp_path / "modules.builtin").write_text("kernel/drivers/virtio/virtio_pci.ko\n"
                                                  "kernel/drivers/virtio/virtio_mmio.ko\n")
        return tmp_path

    def test_dependencies_come_first_and_builtins_are_skipped(self, mod_root: Path) -> None:
        order = _initramfs().resolve(mod_root, _initramfs().WANTED)
        names = [Path(p).name for p in order]
        assert "virtio_pci.ko" not in names and "virtio_mmio.ko" not in names
        assert names.index("jbd2.ko") < names.index("ext4.ko")
        assert names.index("crc16.ko") < names.index("ext4.ko")
        assert names.index("failover.ko") < names.index("net_failover.ko") < names.index("virtio_net.ko")
        assert "virtio-rng.ko" in names and len(names) == len(set(names))

    def test_a_missing_module_is_an_error(self, mod_root: Path) -> None:
        with pytest.raises(SystemExit, match="module nvme"):
            _initramfs().resolve(mod_root, ("nvme",))
