"""The bundle store's layout on a device: every path and link name, and the one way to switch ``current``.

Both sides of the store use these rules: the daemon's store (``cuvil_edge/daemon/store.py``), the
device-side deploy step and its switch rules (``deploy/activate.py``, ``bundle/activation.py``),
and the host side of deploy, which reaches the same paths over SFTP (``deploy/layout.py``). The
paths are POSIX strings built from a store root, so the host can name a device's files without
touching them; the few actions here (:func:`point_current`, :func:`read_current`) run on the
machine that holds the store::

    <store>/bundles/<name>/<version>/            an extracted, verified bundle (what the daemon serves)
    <store>/bundles/<name>/current -> <version>  the version served (a relative link: one path component)
    <store>/bundles/<name>/.current.<pid>-<hex>.tmp  the swap link while ``current`` is switched
    <store>/engines/                             TensorRT engines built on the device (by key)
    <store>/deploy/uploads/<sha256>.cvb[.part]   uploads, continued from their size
    <store>/deploy/staging/<name>-<version>.<pid>/   extraction in progress (same file system)
    <store>/deploy/state/<name>.json             previous version, install records, events, pending switch
    <store>/deploy/state/.lock                   flock: one state change at a time on the device
    <store>/deploy/quarantine/<name>/<version>/  a version that failed its gate with nothing to go back to
    <store>/deploy/lock                          one deploy or rollback at a time (JSON lease)
    <store>/deploy/log/activate-<txn>.log        logs of detached deploy steps

Why one swap-link scheme: switching ``current`` is a new link renamed over the old one (atomic on
POSIX: a reader sees the old version or the new one, never none). The swap link's name starts
with a dot, so it is never a valid version (:mod:`cuvil_edge.bundle.names`), and carries the pid
and a random tail, so two switchers never unlink each other's link half-way. ``current.new`` (the
swap link of earlier releases) stays a reserved name: a leftover one is never read as a version.
A switcher killed between link and rename leaves its swap link; the next switch removes it once
its process is gone and it is a minute old (:func:`remove_stale_swap_links`).

This module is pure (``os``, ``posixpath``, ``secrets``, ``time``; fsync rules from ``_atomic``): the device-side deploy step imports it
without the host's SSH stack, and nothing here imports the daemon or deploy.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import secrets
import time
from dataclasses import dataclass

from cuvil_edge._atomic import fsync_dir
from cuvil_edge.bundle.names import check_component, is_safe_component
from cuvil_edge.errors import BundleError

__all__ = [
    "BUNDLES_DIR",
    "CURRENT_LINK",
    "DEFAULT_STORE",
    "MANIFEST_FILE",
    "StoreLayout",
    "fsync_dir",
    "is_swap_link",
    "point_current",
    "read_current",
    "remove_current",
    "remove_stale_swap_links",
    "version_of_link",
]

DEFAULT_STORE = "/var/lib/cuvil-edge"
BUNDLES_DIR = "bundles"
CURRENT_LINK = "current"
MANIFEST_FILE = "manifest.json"
ENGINES_DIR = "engines"
DEPLOY_DIR = "deploy"
_SWAP_PREFIX = ".current."
_SWAP_SUFFIX = ".tmp"
# A swap link lives for one rename; one older than this whose process is gone was left by a crash.
STALE_SWAP_AGE_S = 60.0


@dataclass(frozen=True)
class StoreLayout:
    """Paths of one bundle store, as POSIX strings under ``root``.

    Every path that holds a bundle name or version checks it with the bundle contract's rule
    (:func:`cuvil_edge.bundle.names.check_component`) and raises ``error`` otherwise, so no
    caller can build a path that leaves the store.

    Args:
        root (str): the store root on the machine that holds it. Defaults to ``/var/lib/cuvil-edge``.
        error (type[Exception]): raised for an unsafe name or version. Defaults to BundleError.
    """

    root: str = DEFAULT_STORE
    error: type[Exception] = BundleError

    @classmethod
    def of(cls, root: str | os.PathLike[str], error: type[Exception] = BundleError) -> StoreLayout:
        return cls(os.fspath(root), error)

    def _name(self, name: str) -> str:
        return check_component("name", name, self.error)

    def _version(self, version: str) -> str:
        return check_component("version", version, self.error)

    # -- bundles (what the daemon serves) ----------------------------------------------------

    @property
    def bundles_dir(self) -> str:
        return posixpath.join(self.root, BUNDLES_DIR)

    def bundle_dir(self, name: str) -> str:
        """``<store>/bundles/<name>``: the versions of one model and its ``current`` link."""
        return posixpath.join(self.bundles_dir, self._name(name))

    def version_dir(self, name: str, version: str) -> str:
        return posixpath.join(self.bundle_dir(name), self._version(version))

    def manifest_path(self, name: str, version: str) -> str:
        return posixpath.join(self.version_dir(name, version), MANIFEST_FILE)

    def current_link(self, name: str) -> str:
        return posixpath.join(self.bundle_dir(name), CURRENT_LINK)

    def swap_link(self, name: str) -> str:
        """A fresh swap link path for switching ``current`` (see the module docstring)."""
        return posixpath.join(self.bundle_dir(name), f"{_SWAP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}{_SWAP_SUFFIX}")

    @property
    def engines_dir(self) -> str:
        return posixpath.join(self.root, ENGINES_DIR)

    # -- deploy's own files (outside bundles/, so the daemon never takes them for a version) --

    @property
    def deploy_dir(self) -> str:
        return posixpath.join(self.root, DEPLOY_DIR)

    @property
    def uploads_dir(self) -> str:
        return posixpath.join(self.deploy_dir, "uploads")

    def upload_path(self, sha256: str) -> str:
        """A complete upload; ``<this>.part`` while it is being sent."""
        return posixpath.join(self.uploads_dir, f"{sha256}.cvb")

    @property
    def staging_root(self) -> str:
        """Where extractions happen: on the store's file system, so the final move is one rename."""
        return posixpath.join(self.deploy_dir, "staging")

    def staging_dir(self, name: str, version: str, pid: int | None = None) -> str:
        return posixpath.join(self.staging_root,
                              f"{self._name(name)}-{self._version(version)}.{os.getpid() if pid is None else pid}")

    @property
    def state_dir(self) -> str:
        return posixpath.join(self.deploy_dir, "state")

    def state_path(self, name: str) -> str:
        return posixpath.join(self.state_dir, f"{self._name(name)}.json")

    @property
    def state_lock_path(self) -> str:
        return posixpath.join(self.state_dir, ".lock")

    def state_names(self, entries: list[str]) -> list[str]:
        """Model names whose state files are among ``entries`` (a listing of :attr:`state_dir`)."""
        return sorted(n[:-5] for n in entries if n.endswith(".json") and is_safe_component(n[:-5]))

    def quarantine_dir(self, name: str, version: str) -> str:
        """Where a version that failed its gate on a fresh install waits, out of the daemon's sight."""
        return posixpath.join(self.deploy_dir, "quarantine", self._name(name), self._version(version))

    @property
    def lock_path(self) -> str:
        """The device lock: one deploy or rollback at a time."""
        return posixpath.join(self.deploy_dir, "lock")

    @property
    def log_dir(self) -> str:
        return posixpath.join(self.deploy_dir, "log")

    def log_path(self, txn: str) -> str:
        return posixpath.join(self.log_dir, f"activate-{txn}.log")

    def deploy_paths(self, name: str, version: str, sha256: str | None = None) -> dict[str, str]:
        """The paths a deploy of ``name`` ``version`` touches, by role: what the device-side probe
        hands to callers that act with shell commands (the Ansible role), so they hold no rules."""
        paths = {"bundle_dir": self.bundle_dir(name), "version_dir": self.version_dir(name, version),
                 "current_link": self.current_link(name), "uploads_dir": self.uploads_dir,
                 "staging_root": self.staging_root, "state_dir": self.state_dir,
                 "state_path": self.state_path(name), "quarantine_dir": self.quarantine_dir(name, version)}
        if sha256:
            paths["upload"] = self.upload_path(sha256)
        return paths


def is_swap_link(entry: str) -> bool:
    """Whether a directory entry of ``bundles/<name>/`` is a swap link (this scheme's or an older one)."""
    return entry == "current.new" or (entry.startswith(_SWAP_PREFIX) and entry.endswith(_SWAP_SUFFIX))


def version_of_link(target: str) -> str:
    """The version a ``current`` link's target names (its last path component)."""
    return posixpath.basename(target.rstrip("/"))


def read_current(layout: StoreLayout, name: str) -> str | None:
    """The version ``current`` of ``name`` points at; None when there is no link."""
    try:
        return version_of_link(os.readlink(layout.current_link(name)))
    except OSError:
        return None


def point_current(layout: StoreLayout, name: str, version: str) -> None:
    """Point ``current`` of ``name`` at ``version`` atomically: a swap link renamed over the old
    link, then the directory synced. The link is relative (``current -> <version>``), so the store
    can move or be mounted elsewhere.

    Raises:
        FileNotFoundError: ``version`` has no ``manifest.json`` in the store (nothing changed).
    """
    if not os.path.isfile(layout.manifest_path(name, version)):
        raise FileNotFoundError(f"{layout.version_dir(name, version)}: no such version in the store")
    remove_stale_swap_links(layout, name)
    swap = layout.swap_link(name)
    os.symlink(version, swap)
    try:
        os.replace(swap, layout.current_link(name))
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(swap)
        raise
    fsync_dir(layout.bundle_dir(name))


def remove_stale_swap_links(layout: StoreLayout, name: str, min_age_s: float = STALE_SWAP_AGE_S) -> list[str]:
    """Remove the swap links a switcher killed between link and rename left behind; their names.

    A link is stale when the process its name carries is gone *and* it is older than
    ``min_age_s``: a live switcher's link (the pid alive, or a process of another pid namespace
    sharing the store, which the age guards) is never touched. ``current.new`` of earlier
    releases counts once it is that old. Errors are ignored: cleaning never stops a switch.
    """
    removed: list[str] = []
    folder = layout.bundle_dir(name)
    try:
        entries = os.listdir(folder)
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        if not is_swap_link(entry):
            continue
        path = posixpath.join(folder, entry)
        try:
            if now - os.lstat(path).st_mtime < min_age_s or _swap_owner_alive(entry):
                continue
            os.unlink(path)
            removed.append(entry)
        except OSError:
            continue
    return removed


def _swap_owner_alive(entry: str) -> bool:
    """Whether the process named in a swap link's name still runs (unknown names: no owner)."""
    pid_part = entry[len(_SWAP_PREFIX):].split("-", 1)[0] if entry.startswith(_SWAP_PREFIX) else ""
    if not pid_part.isdigit():
        return False
    try:
        os.kill(int(pid_part), 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it runs under another user
        return True
    return True


def remove_current(layout: StoreLayout, name: str) -> None:
    """Remove ``current`` of ``name`` (the daemon then serves the only version, if there is one)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(layout.current_link(name))
    fsync_dir(layout.bundle_dir(name))
