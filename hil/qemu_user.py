"""qemu-user target of the HIL rig: run aarch64 programs here, on a chosen CPU model.

``CPU_MODELS`` is the matrix the kernel proofs run on (QEMU 7.2 has no cortex-a78ae): Orin's stand-in
(cortex-a76, NEON only), neoverse-n1, ``max`` with SVE off, and ``max`` at SVE vector lengths
of 16 (Thor/Grace), 32, 64 and 256 bytes. In user mode ``sve-default-vector-length`` sets the
length; ``sveNNN=on`` only raises the maximum.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CPU_MODELS", "CpuModel", "ROOTFS_DIR", "ensure_rootfs", "qemu_binary", "run"]

REPO = Path(__file__).resolve().parent.parent
ROOTFS_DIR = Path(os.environ.get("CUVIL_ROOTFS", Path.home() / ".cache" / "cuvil-edge" / "rootfs-arm64-bookworm"))
CROSS_LIBS = Path("/usr/aarch64-linux-gnu")


@dataclass(frozen=True)
class CpuModel:
    """A QEMU ``-cpu`` string and what the kernels must report on it."""

    name: str
    cpu: str
    best_isa: str
    vector_bytes: int


CPU_MODELS = (
    CpuModel("cortex-a76", "cortex-a76", "neon", 0),
    CpuModel("neoverse-n1", "neoverse-n1", "neon", 0),
    CpuModel("max-sve-off", "max,sve=off", "neon", 0),
    CpuModel("max-vl16", "max,sve-default-vector-length=16", "sve2", 16),
    CpuModel("max-vl32", "max,sve-default-vector-length=32", "sve2", 32),
    CpuModel("max-vl64", "max,sve-default-vector-length=64", "sve2", 64),
    CpuModel("max-vl256", "max,sve-default-vector-length=256", "sve2", 256),
)


def qemu_binary(plugins: bool = False) -> str:
    """Returns the qemu-aarch64 to use: the dynamic one (accepts ``-plugin``) when present."""
    for name in ("qemu-aarch64", "qemu-aarch64-static"):
        if plugins and name.endswith("static"):
            continue
        path = shutil.which(name)
        if path:
            return path
    raise FileNotFoundError("qemu-aarch64 not found: apt-get install qemu-user qemu-user-static")


def ensure_rootfs() -> Path:
    """Builds (once, cached) the arm64 Debian root file system with python3 + numpy.

    Raises:
        RuntimeError: when it cannot be made (no mirror, no debootstrap): never a silent skip.
    """
    if (ROOTFS_DIR / ".cuvil-rootfs-ok").is_file():
        return ROOTFS_DIR
    proc = subprocess.run([str(REPO / "hil" / "make_rootfs.sh"), str(ROOTFS_DIR)], capture_output=True,
                          text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"hil/make_rootfs.sh failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return ROOTFS_DIR


def run(argv: list[str], cpu: str, *, rootfs: Path | None = None, env: dict[str, str] | None = None,
        timeout: float = 300, plugin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Runs an aarch64 program under qemu-user on CPU model ``cpu``.

    Args:
        argv (list[str]): program and arguments (paths on this machine, or inside ``rootfs``).
        cpu (str): QEMU ``-cpu`` value, e.g. ``"max,sve-default-vector-length=16"``.
        rootfs (Path | None): library prefix (``QEMU_LD_PREFIX``). Defaults to the cross toolchain's.
        env (dict | None): extra environment variables. Defaults to None.
        timeout (float): seconds. Defaults to 300.
        plugin (str | None): a TCG plugin argument (``path,opt=..``); output goes to stderr.

    Returns:
        subprocess.CompletedProcess: with text stdout and stderr.
    """
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env["QEMU_CPU"] = cpu
    full_env["QEMU_LD_PREFIX"] = str(rootfs or CROSS_LIBS)
    cmd = [qemu_binary(plugins=plugin is not None)]
    if plugin:
        cmd += ["-plugin", plugin, "-d", "plugin"]
    return subprocess.run(cmd + list(argv), capture_output=True, text=True, env=full_env, timeout=timeout)
