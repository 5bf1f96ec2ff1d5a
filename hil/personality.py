"""A Jetson personality for the emulated board: the identity the probe reads, and tegrastats.

What a board shows of itself, planted where the real one keeps it:

* the device-tree ``model`` and ``compatible`` strings: QEMU's own device tree for the ``virt``
  machine, dumped (``-M virt,dumpdtb=``) and edited with ``fdtput``, is passed back with ``-dtb``,
  so the guest kernel itself reports ``/proc/device-tree/model`` (no bind mount over /proc);
* ``/etc/nv_tegra_release``, the first line as L4T writes it;
* ``/usr/bin/tegrastats``: a stand-in that replays lines recorded on a real Jetson at the real
  interval (``hil/standins/tegrastats``; its docstring says so).

Nothing else pretends: there is no GPU, TensorRT or nvmap on the emulated board.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hil.errors import BootError, HilError

if TYPE_CHECKING:
    from hil.board import Board

__all__ = ["PERSONALITIES", "Personality", "apply_personality", "personality_dtb"]

HERE = Path(__file__).resolve().parent
RECORDINGS = HERE.parent / "tests" / "data" / "tegrastats"


@dataclass(frozen=True)
class Personality:
    """The identity files of one Jetson board profile."""

    model: str
    compatible: tuple[str, ...]
    nv_tegra_release: str
    recording: str  # file under tests/data/tegrastats


PERSONALITIES: dict[str, Personality] = {
    # Orin Nano 8GB developer kit on JetPack 6.2 (L4T R36.4.3), as the board prints them.
    "orin-nano-8gb": Personality(
        model="NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super",
        compatible=("nvidia,p3768-0000+p3767-0005-super", "nvidia,p3767-0005", "nvidia,tegra234"),
        nv_tegra_release="# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, "
                         "DATE: Tue Jan  8 21:12:29 UTC 2025\n# KERNEL_VARIANT: oot\n",
        recording="orin_jp6.log",
    ),
}


def _get(board: str) -> Personality:
    if board not in PERSONALITIES:
        raise HilError(f"no Jetson personality for board '{board}'; known: {', '.join(sorted(PERSONALITIES))}")
    return PERSONALITIES[board]


def personality_dtb(board: str, run_dir: Path, dump_argv: Callable[[Path], list[str]]) -> Path:
    """QEMU's device tree for this VM with the board's model and compatible strings.

    Args:
        board (str): board profile.
        run_dir (Path): where the ``.dtb`` goes.
        dump_argv (Callable[[Path], list[str]]): the VM's own QEMU command line with
            ``dumpdtb=<path>`` (the tree must match the VM's memory, CPUs and devices).
    """
    p = _get(board)
    if shutil.which("fdtput") is None:
        raise BootError("fdtput not found: run scripts/bootstrap.sh test (apt: device-tree-compiler)")
    dtb = run_dir / "board.dtb"
    res = subprocess.run(dump_argv(dtb), capture_output=True, text=True, timeout=60)
    if not dtb.is_file():
        raise BootError(f"QEMU did not dump its device tree ({res.returncode}): {res.stderr.strip()[-400:]}")
    for argv in (["fdtput", "-t", "s", str(dtb), "/", "model", p.model],
                 ["fdtput", "-t", "s", str(dtb), "/", "compatible", *p.compatible]):
        subprocess.run(argv, check=True, capture_output=True, timeout=30)
    return dtb


def apply_personality(board: Board, name: str) -> None:
    """Plants ``/etc/nv_tegra_release`` and the tegrastats stand-in on a booted board."""
    p = _get(name)
    recording = RECORDINGS / p.recording
    board.ssh("mkdir -p /usr/share/cuvil-hil")
    board.put(recording, "/usr/share/cuvil-hil/tegrastats.log")
    board.put(HERE / "standins" / "tegrastats", "/usr/bin/tegrastats")
    board.ssh("chmod 755 /usr/bin/tegrastats && cat > /etc/nv_tegra_release", input=p.nv_tegra_release)
