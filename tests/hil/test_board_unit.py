"""Board and suite pieces that need no VM: QEMU's command line, the console tail, suite contents."""

from __future__ import annotations

from pathlib import Path

import pytest

from hil.board import Board, _qemu_argv
from hil.errors import HilError
from hil.images import BoardImage
from hil.suite import CUTS, checks_for
from hil.targets import get_hil_target


def test_qemu_command_line_forwards_loopback_only_and_keeps_the_image_pristine(tmp_path: Path) -> None:
    t = get_hil_target("qemu-system")
    argv = _qemu_argv(BoardImage(tmp_path / "img"), t, 1024, 2, tmp_path / "o.qcow2", tmp_path / "c.log",
                      {22: 40022, 8000: 40800})
    line = " ".join(argv)
    assert "hostfwd=tcp:127.0.0.1:40022-:22" in line and "hostfwd=tcp:127.0.0.1:40800-:8000" in line
    assert "romfile=" in line  # without it QEMU stops on a missing efi-virtio.rom
    assert f"file={tmp_path / 'o.qcow2'},if=virtio,format=qcow2" in line  # the overlay, never disk.raw
    assert argv[argv.index("-cpu") + 1] == "cortex-a76" and argv[argv.index("-m") + 1] == "1024"
    assert "systemd.mask=e2scrub_reap.service" in line


def test_console_tail_drops_colour_codes_and_progress_spinners(tmp_path: Path) -> None:
    (tmp_path / "console.log").write_bytes(
        b"[    1.0] Booting Linux\r\n"
        b"\x1b[K[\x1b[0;1;31m*\x1b[0m\x1b[0;31m*     \x1b[0m] A start job is running for /dev/vda (10s / 1min 30s)\r"
        b"\x1b[K[ \x1b[0;31m*\x1b[0;1;31m*\x1b[0m\x1b[0;31m*  \x1b[0m] (2 of 3) Job ssh.service/start running (3min 25s)\r\n"
        b"[   60.1] systemd[1]: Started systemd-journald.service\r\n")
    board = Board(target=get_hil_target("qemu-system"), host="127.0.0.1", ssh_port=1, workdir=tmp_path)
    tail = board.console_tail()
    assert tail.splitlines() == ["[    1.0] Booting Linux", "[   60.1] systemd[1]: Started systemd-journald.service"]


def test_smoke_is_the_ci_subset_of_full() -> None:
    smoke = [c.name for c in checks_for("smoke")]
    full = [c.name for c in checks_for("full")]
    assert smoke == ["boot", "login_sudo_user", "install_project", "kernels_isa", "install_daemon_ready", "deploy_fresh",
                     "infer_equals_fp32", "top_over_ssh"]
    assert full[: len(smoke)] == smoke and len(full) == 17 + len(CUTS) and len(CUTS) >= 12
    powercut = [c.name for c in checks_for("powercut")]
    assert powercut[:4] == ["boot", "install_project", "install_daemon_ready", "deploy_fresh"]
    assert powercut[4:] == [f"powercut[{c.name}]" for c in CUTS] and not set(powercut[4:]) & set(smoke)
    assert len({c.name for c in CUTS}) == len(CUTS)  # each cut at its own point
    assert [c.name for c in checks_for("boot")] == ["boot"]
    with pytest.raises(HilError, match="unknown suite"):
        checks_for("quick")
