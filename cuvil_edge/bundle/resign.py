"""Re-sign a bundle with another key (e.g. a release key after CI built it)."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

from cuvil_edge._atomic import atomic_output
from cuvil_edge.bundle.container import MANIFEST_NAME, SIGNATURE_NAME, resolve_secret_key, verify_bundle
from cuvil_edge.bundle.manifest import Manifest
from cuvil_edge.bundle.signing import SecretKey, sign_bytes

__all__ = ["resign_bundle"]


def resign_bundle(bundle: Path, secret_key: Path | SecretKey | None) -> Manifest:
    """Check the bundle's integrity, then replace its signature atomically (payload bytes unchanged)."""
    bundle = Path(bundle)
    manifest = verify_bundle(bundle)
    key = resolve_secret_key(secret_key)
    data = manifest.to_dict()
    data["key_id"] = key.public.key_id_hex
    manifest = Manifest.from_dict(data)
    manifest_bytes = manifest.to_bytes()
    sig = sign_bytes(
        manifest_bytes,
        key,
        trusted_comment=(
            f"cuvil-bundle {manifest.name} {manifest.version} target={manifest.target_name} "
            f"sha256={hashlib.sha256(manifest_bytes).hexdigest()}"
        ),
    ).encode()
    with open(bundle, "rb") as src_f, tarfile.open(fileobj=src_f, mode="r|") as src, atomic_output(
        bundle
    ) as out_f, tarfile.open(fileobj=out_f, mode="w|", format=tarfile.PAX_FORMAT) as out:
        while (info := src.next()) is not None:
            if info.name == MANIFEST_NAME:
                info.size = len(manifest_bytes)
                out.addfile(info, io.BytesIO(manifest_bytes))
            elif info.name == SIGNATURE_NAME:
                info.size = len(sig)
                out.addfile(info, io.BytesIO(sig))
            else:
                out.addfile(info, src.extractfile(info))
    return manifest
