"""Bundles: one signed file with the model, its recipe, validation evidence and device plugins.

Names resolve on first use (PEP 562): the daemon imports ``bundle.layout``, ``bundle.manifest``
and the engine store, and only a daemon told to verify signatures (``--pub``) loads the signing
code and its ``cryptography`` dependency (6 MB resident on a board whose RAM the models share).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cuvil_edge.bundle.container import (
        MANIFEST_NAME,
        SIGNATURE_NAME,
        extract_bundle,
        read_manifest,
        resolve_secret_key,
        verify_bundle,
        verify_directory,
        write_bundle,
    )
    from cuvil_edge.bundle.manifest import FORMAT, BundleTarget, FileEntry, Manifest, TargetRelease
    from cuvil_edge.bundle.signing import generate_keypair, load_public_key, load_secret_key

__all__ = [
    "FORMAT",
    "MANIFEST_NAME",
    "SIGNATURE_NAME",
    "BundleTarget",
    "FileEntry",
    "Manifest",
    "TargetRelease",
    "extract_bundle",
    "generate_keypair",
    "load_public_key",
    "load_secret_key",
    "read_manifest",
    "resolve_secret_key",
    "verify_bundle",
    "verify_directory",
    "write_bundle",
]

_WHERE = {
    "MANIFEST_NAME": "container", "SIGNATURE_NAME": "container", "extract_bundle": "container",
    "read_manifest": "container", "resolve_secret_key": "container", "verify_bundle": "container",
    "verify_directory": "container", "write_bundle": "container",
    "FORMAT": "manifest", "BundleTarget": "manifest", "FileEntry": "manifest", "Manifest": "manifest",
    "TargetRelease": "manifest",
    "generate_keypair": "signing", "load_public_key": "signing", "load_secret_key": "signing",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'cuvil_edge.bundle' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"cuvil_edge.bundle.{module}"), name)
    globals()[name] = value
    return value
