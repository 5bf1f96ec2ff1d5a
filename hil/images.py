"""The emulated board's image: content-addressed by its own inputs, built once, cached.

The image is named by the SHA-256 of the files in ``hil/image/`` (build script, Debian package
list, pinned aarch64 wheels, initramfs builder) and lives in
``~/.cache/cuvil-edge/hil/<hash>/`` (``CUVIL_HIL_CACHE`` overrides the parent). The project's
own code is not an input: the rig installs a wheel of the tree under test at run time, so a code
change never rebuilds the image. A build writes into a temporary folder and renames it into
place only when every step passed, so a cache entry is complete or absent.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hil.errors import ImageError

__all__ = ["BoardImage", "CACHE_ROOT", "IMAGE_INPUTS", "ensure_image", "image_hash"]

IMAGE_INPUTS = Path(__file__).resolve().parent / "image"
CACHE_ROOT = Path(os.environ.get("CUVIL_HIL_CACHE", Path.home() / ".cache" / "cuvil-edge" / "hil"))
STEPS = 7  # "==> " lines build.sh prints before "==> done"


@dataclass(frozen=True)
class BoardImage:
    """A finished image: the files ``qemu-system-aarch64`` boots and the key that logs in."""

    dir: Path

    @property
    def disk(self) -> Path:
        return self.dir / "disk.raw"

    @property
    def kernel(self) -> Path:
        return self.dir / "vmlinuz"

    @property
    def initrd(self) -> Path:
        return self.dir / "initrd.img"

    @property
    def key(self) -> Path:
        return self.dir / "id_ed25519"

    @property
    def manifest(self) -> dict[str, str]:
        return json.loads((self.dir / "manifest.json").read_text())

    @property
    def login_user(self) -> str:
        """The user the rig logs in as (root SSH is refused on images that name one)."""
        return str(self.manifest.get("login_user", "root"))

    def complete(self) -> bool:
        return all(p.is_file() for p in (self.disk, self.kernel, self.initrd, self.key, self.dir / "manifest.json"))


def image_hash(inputs: Path = IMAGE_INPUTS) -> str:
    """SHA-256 (first 16 hex digits) over the names and bytes of the image's input files."""
    digest = hashlib.sha256()
    for path in sorted(p for p in inputs.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(path.relative_to(inputs).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def ensure_image(cache_root: Path | None = None, console: object | None = None,
                 timeout: float = 3600) -> BoardImage:
    """Returns the cached image for the current inputs, building it first when absent.

    Args:
        cache_root (Path | None): parent of the ``<hash>/`` folders. Defaults to ``CACHE_ROOT``.
        console (rich.console.Console | None): where progress goes. Defaults to stderr.
        timeout (float): seconds the whole build may take. Defaults to 3600.

    Raises:
        ImageError: the build failed; the message carries the failing step and its log's tail.
    """
    forced = os.environ.get("CUVIL_HIL_IMAGE")
    if forced:  # a given image folder (debugging an image, or a board image built elsewhere)
        image = BoardImage(Path(forced))
        if not image.complete():
            raise ImageError(f"CUVIL_HIL_IMAGE={forced}: not a complete board image (disk.raw, vmlinuz, "
                             "initrd.img, id_ed25519, manifest.json)")
        return image
    root = Path(cache_root) if cache_root is not None else CACHE_ROOT
    image = BoardImage(root / image_hash())
    if image.complete():
        return image
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    con = console if console is not None else Console(stderr=True)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{image.dir.name}.tmp.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    log_path = root / f"{image.dir.name}.build.log"
    env = dict(os.environ, CUVIL_HIL_PIP_PYTHON=sys.executable)
    t0 = time.monotonic()
    step = "start"
    with open(log_path, "w") as log, Progress(
        TextColumn("[bold]board image[/] {task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), console=con,  # type: ignore[arg-type]
    ) as progress:
        task = progress.add_task("starting", total=STEPS)
        proc = subprocess.Popen(["nice", "-n", "10", str(IMAGE_INPUTS / "build.sh"), str(tmp)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env)
        assert proc.stdout is not None
        seen = 0
        for line in proc.stdout:
            log.write(f"[{time.monotonic() - t0:7.1f} s] {line}" if line.startswith("==> ") else line)
            log.flush()
            if line.startswith("==> ") and line[4:].strip() != "done":
                step = line[4:].strip()
                progress.update(task, description=step, completed=seen)
                seen += 1
            if time.monotonic() - t0 > timeout:
                proc.kill()
        rc = proc.wait()
        if rc == 0:
            progress.update(task, description="ready", completed=STEPS)
    if rc != 0:
        tail = "".join(log_path.read_text(errors="replace").splitlines(keepends=True)[-15:])
        shutil.rmtree(tmp, ignore_errors=True)
        raise ImageError(f"board image build failed at step '{step}' (exit {rc}); log {log_path}:\n{tail}")
    shutil.rmtree(tmp / "root", ignore_errors=True)
    if image.dir.exists():
        shutil.rmtree(image.dir)
    os.replace(tmp, image.dir)
    (image.dir / "build-seconds.txt").write_text(f"{time.monotonic() - t0:.1f}\n")
    return image
