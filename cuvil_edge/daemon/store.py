"""The bundle store on the device: ``<root>/bundles/<name>/<version>/`` plus a ``current`` link.

Layout (docs/bundle-format.md; the paths and the switch of ``current`` are
:mod:`cuvil_edge.bundle.layout`'s, shared with deploy)::

    <root>/bundles/efficientnet-lite0/1.0.0/manifest.json ...
    <root>/bundles/efficientnet-lite0/1.1.0/...
    <root>/bundles/efficientnet-lite0/current -> 1.1.0

The daemon serves ``current`` of each model (or the only version when there is no link). The
deploy tool flips ``current`` atomically (a new link renamed over the old one) and sends SIGHUP;
:meth:`BundleStore.install` does the same for tests and the demo.

Names and versions follow the bundle contract's one rule (:mod:`cuvil_edge.bundle.names`) at
every door: lookups refuse anything that is not one safe path component before touching the file
system, and :meth:`BundleStore.install` checks the signature and the names before it writes or
deletes anything. Installing needs the public key unless ``allow_unsigned`` says otherwise.
Manifests are read with the typed parser (:class:`cuvil_edge.bundle.Manifest`), which owns the
rules of which fields a served bundle needs.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from cuvil_edge.bundle import layout as _layout
from cuvil_edge.bundle.layout import StoreLayout
from cuvil_edge.bundle.manifest import Manifest
from cuvil_edge.bundle.names import check_component, is_safe_component
from cuvil_edge.errors import DaemonError, SignatureError

__all__ = ["BundleStore", "read_manifest"]


def read_manifest(bundle_dir: Path) -> Manifest:
    """The typed manifest of an extracted bundle directory the daemon serves (no signature check).

    Raises:
        BundleError: missing, unreadable or incomplete ``manifest.json`` (the message names the field).
    """
    return Manifest.load(Path(bundle_dir) / "manifest.json", complete=False)


class BundleStore:
    """Bundles on disk, by model name and version.

    Args:
        root (Path): the store root (``bundles/`` lives under it).
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.layout = StoreLayout.of(self.root, DaemonError)
        self.bundles = Path(self.layout.bundles_dir)

    def check(self) -> None:
        """Raise DaemonError unless the store exists and is readable (creating ``bundles/``)."""
        if not self.root.is_dir():
            raise DaemonError(f"bundle store {self.root} does not exist; create it or pass --store")
        try:
            self.bundles.mkdir(exist_ok=True)
            os.listdir(self.bundles)
        except OSError as exc:
            raise DaemonError(f"bundle store {self.bundles} is not usable: {exc}") from exc

    def names(self) -> list[str]:
        """Model names that have at least one version."""
        if not self.bundles.is_dir():
            return []
        return sorted(p.name for p in self.bundles.iterdir()
                      if is_safe_component(p.name) and p.is_dir() and self.versions(p.name))

    def versions(self, name: str) -> list[str]:
        """Versions of ``name`` present (directories holding a manifest.json); none for an unsafe name."""
        if not is_safe_component(name):
            return []
        d = Path(self.layout.bundle_dir(name))
        if not d.is_dir():
            return []
        return sorted(p.name for p in d.iterdir()
                      if is_safe_component(p.name) and not p.is_symlink() and (p / "manifest.json").is_file())

    def current(self, name: str) -> str | None:
        """The version ``current`` points at; the only version when there is no link; else None."""
        if not is_safe_component(name):
            return None
        version = _layout.read_current(self.layout, name)
        if version is not None:
            return version
        versions = self.versions(name)
        return versions[0] if len(versions) == 1 else None

    def path(self, name: str, version: str | None = None) -> Path:
        """Directory of ``name`` at ``version`` (default: current).

        Raises:
            DaemonError: no such model or version, or no current version.
        """
        try:
            check_component("name", name, DaemonError)
        except DaemonError as exc:
            raise DaemonError(f"invalid model name: {exc}") from None
        if version is None:
            version = self.current(name)
            if version is None:
                if not self.versions(name):
                    raise DaemonError(f"model {name!r} is not in the store")
                raise DaemonError(f"model {name!r} has several versions and no 'current' link in "
                                  f"{self.bundles / name}; point current at one")
        try:
            check_component("version", version, DaemonError)
        except DaemonError as exc:
            raise DaemonError(f"invalid version: {exc}") from None
        d = Path(self.layout.version_dir(name, version))
        if not Path(self.layout.manifest_path(name, version)).is_file():
            raise DaemonError(f"model {name!r} version {version!r} is not in the store")
        # A version is a directory of the store: one reached through a symlink (the version or
        # the model's directory) or resolving elsewhere is refused, whatever its files hash to.
        bundles = os.path.realpath(self.bundles)
        if d.is_symlink() or d.parent.is_symlink() or os.path.commonpath(
                [bundles, os.path.realpath(d)]) != bundles:
            raise DaemonError(f"model {name!r} version {version!r}: {d} is a symlink or lies outside the store "
                              f"{self.bundles}; refused (install bundles with cuvil-edge deploy)")
        return d

    def manifest(self, name: str, version: str | None = None) -> Manifest:
        """The typed manifest of ``name`` at ``version`` (default: current).

        Raises:
            DaemonError: no such model or version.
            BundleError: its manifest is unreadable or incomplete.
        """
        return read_manifest(self.path(name, version))

    def set_current(self, name: str, version: str) -> None:
        """Point ``current`` at ``version`` atomically (:func:`cuvil_edge.bundle.layout.point_current`)."""
        self.path(name, version)
        _layout.point_current(self.layout, name, version)

    def install(self, source: Path, make_current: bool = True, public_key: Any = None,
                allow_unsigned: bool = False) -> tuple[str, str]:
        """Copy a bundle (extracted directory or ``.cvb`` file) into the store.

        The signature (with ``public_key``) and the name and version are checked before anything
        is written; the bundle lands in a temporary directory beside its place and is renamed
        there only once every member verified. An installed version is never replaced.

        Args:
            source (Path): a ``.cvb`` file or an extracted bundle directory.
            make_current (bool): point ``current`` at the new version. Defaults to True.
            public_key (Path | PublicKey | None): the minisign public key the bundle must verify
                with. Required unless ``allow_unsigned``.
            allow_unsigned (bool): install without checking who signed it (tests, local trials).
                Defaults to False.

        Returns:
            tuple[str, str]: (name, version).

        Raises:
            SignatureError: no key given without ``allow_unsigned``, or the signature does not verify.
            BundleError: not a bundle, unsafe name or version, a member fails its checksum.
        """
        source = Path(source)
        if public_key is None and not allow_unsigned:
            raise SignatureError(f"{source}: installing needs the signer's public key (pass it, or "
                                 "allow_unsigned=True / --allow-unsigned to skip the check)")
        if source.is_file():
            from cuvil_edge.bundle import extract_bundle
            from cuvil_edge.bundle import read_manifest as read_signed_manifest

            m = read_signed_manifest(source, public_key)  # signature and names, before any write
            name, version = m.name, m.version
            dest = Path(self.layout.version_dir(name, version))
            if not dest.exists():
                dest.parent.mkdir(parents=True, exist_ok=True)
                extract_bundle(source, dest, public_key)
        else:
            if public_key is not None:
                from cuvil_edge.bundle import verify_directory

                verify_directory(source, public_key)
            served = read_manifest(source)  # names checked by the parser, before any write
            name, version = served.name, served.version
            dest = Path(self.layout.version_dir(name, version))
            if not dest.exists():
                dest.parent.mkdir(parents=True, exist_ok=True)
                tmp = Path(tempfile.mkdtemp(prefix=f".{version}.", dir=dest.parent))
                try:
                    shutil.copytree(source, tmp, dirs_exist_ok=True, symlinks=True)
                    os.rename(tmp, dest)
                except BaseException:
                    shutil.rmtree(tmp, ignore_errors=True)
                    raise
        if make_current:
            self.set_current(name, version)
        return name, version
