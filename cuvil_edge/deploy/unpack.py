"""Device-side unpack of an uploaded bundle: extract, make durable, verify, rename into the store.

Runs on the device (``python -m cuvil_edge.deploy.ondevice unpack``), after the host's upload,
in this order, so a power cut at any moment leaves either no version directory or a complete
one whose every byte is on the disk (RAUC and Mender promise the same of a slot):

1. ``tar`` extracts ``deploy/uploads/<sha256>.cvb`` into ``deploy/staging/<name>-<version>.<pid>/``;
2. every extracted file and directory is fsynced (:func:`cuvil_edge._atomic.fsync_tree`), so the
   check below reads what the disk holds after a cut, not only the page cache;
3. ``manifest.json`` must be the bytes the host verified (its sha256), and every file must match
   the manifest's sha256 (:func:`cuvil_edge.bundle.container.verify_directory`), the signature
   file must be there;
4. the staging directory is renamed to ``bundles/<name>/<version>`` and both parents are fsynced,
   so the rename itself survives a cut.

A failure removes the staging directory and leaves the store as it was. Imports stay light (no
SSH stack): the device's Python runs this.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from cuvil_edge._atomic import fsync_dir, fsync_tree
from cuvil_edge.bundle.layout import StoreLayout
from cuvil_edge.errors import BundleError, DeployError

__all__ = ["UnpackError", "makedirs_durably", "unpack_upload"]

MANIFEST_NAME = "manifest.json"
SIGNATURE_NAME = "manifest.json.minisig"


class UnpackError(DeployError):
    """The upload could not be extracted or its files do not match the manifest (store unchanged)."""


def makedirs_durably(path: str) -> None:
    """``os.makedirs`` that fsyncs the parent of every directory it creates."""
    missing: list[str] = []
    p = os.path.abspath(path)
    while not os.path.isdir(p):
        missing.append(p)
        p = os.path.dirname(p)
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(d)
        fsync_dir(os.path.dirname(d))


def unpack_upload(store: str, name: str, version: str, sha256: str, manifest_sha256: str,
                  pause: Any = None) -> dict[str, Any]:
    """Extract the upload of bundle ``sha256`` and install it as ``name`` ``version`` (see the module docstring).

    Args:
        store (str): the store root.
        name (str): bundle name (checked as one path component).
        version (str): bundle version (checked likewise).
        sha256 (str): sha256 of the uploaded ``.cvb``: names the upload.
        manifest_sha256 (str): sha256 of the manifest the host verified with the signature.
        pause (Callable[[str], None] | None): called at ``extract`` (files written, not yet
            synced); the rig's power-cut hook. Defaults to None.

    Returns:
        dict: ``{"version_dir", "files"}`` (files synced).

    Raises:
        UnpackError: tar failed, the manifest is not the verified one, a file's sha256 differs,
            or the signature file is missing.
    """
    from cuvil_edge.bundle.container import verify_directory

    layout = StoreLayout.of(store, DeployError)
    upload = layout.upload_path(sha256)
    dest = layout.version_dir(name, version)
    staging = layout.staging_dir(name, version)
    if not os.path.isfile(upload):
        raise UnpackError(f"{upload}: no such upload; send the bundle again")
    shutil.rmtree(staging, ignore_errors=True)
    makedirs_durably(staging)
    try:
        out = subprocess.run(["tar", "-x", "--no-same-owner", "--no-same-permissions", "-f", upload, "-C", staging],
                             capture_output=True, text=True, timeout=1800)
        if out.returncode != 0:
            raise UnpackError(f"tar could not extract {upload}: {out.stderr.strip()[:300]}")
        if pause is not None:
            pause("extract")
        synced = fsync_tree(staging)
        try:
            with open(os.path.join(staging, MANIFEST_NAME), "rb") as f:
                got = hashlib.sha256(f.read()).hexdigest()
        except OSError as exc:
            raise UnpackError(f"{upload}: no {MANIFEST_NAME} after extraction ({exc.strerror})") from None
        if got != manifest_sha256:
            raise UnpackError(f"{upload}: its {MANIFEST_NAME} is not the one the host verified")
        try:
            verify_directory(Path(staging))
        except BundleError as exc:
            raise UnpackError(f"extracted files do not match the manifest: {exc}") from None
        if not os.path.isfile(os.path.join(staging, SIGNATURE_NAME)):
            raise UnpackError(f"{SIGNATURE_NAME} missing after extraction")
        makedirs_durably(layout.bundle_dir(name))
        if os.path.isdir(dest):
            raise UnpackError(f"{dest} exists; remove it or give the bundle a new version")
        os.rename(staging, dest)
        fsync_dir(layout.bundle_dir(name))
        fsync_dir(layout.staging_root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    with contextlib.suppress(FileNotFoundError):
        os.unlink(upload)
    return {"version_dir": dest, "files": synced}
