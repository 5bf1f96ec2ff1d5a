"""Bundles: one signed file with the model, its recipe, validation evidence and device plugins."""

from __future__ import annotations

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
