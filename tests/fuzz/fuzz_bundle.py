"""Fuzz target: the bundle reader (manifest parser, and the whole streamed ``.cvb`` check).

The first input byte picks the door: the manifest JSON alone (``Manifest.from_bytes``, what
``verify`` and the daemon's store parse), or a whole bundle file read as ``verify_bundle`` and
``read_manifest`` do, with a real key. Promise: BundleError (SignatureError included) or success.
"""

from __future__ import annotations

import io
import os
import sys
import tempfile
from pathlib import Path

import atheris
from _harness import main  # the repository first on sys.path

with atheris.instrument_imports(include=["cuvil_edge"]):
    from cuvil_edge.bundle import Manifest, generate_keypair, read_manifest, verify_bundle, write_bundle
    from cuvil_edge.bundle.names import check_bundle_names
    from cuvil_edge.errors import BundleError


_DIR = Path(tempfile.mkdtemp(prefix="cuvil-fuzz-bundle-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
_KEY, _PUB = _DIR / "k.key", _DIR / "k.pub"
generate_keypair(_KEY, _PUB)
_FILE = _DIR / "input.cvb"
BASE = {"name": "tiny", "version": "1.0.0", "target": {"name": "x86-host"}, "precision": "fp32",
        "format_kind": "ort-cpu", "model": "model.onnx", "inputs": [{"name": "x", "dtype": "float32",
        "shape": [-1, 4]}], "outputs": [], "max_batch": 4, "preprocess": {"kind": "none"}}


def test_one_input(data: bytes) -> None:
    if not data:
        return
    door, body = data[0] % 2, data[1:]
    try:
        if door == 0:
            m = Manifest.from_bytes(body, "fuzz")
            check_bundle_names(m.name, m.version)  # what parsing promised
        else:
            _FILE.write_bytes(body)
            m = read_manifest(_FILE)
            check_bundle_names(m.name, m.version)
            verify_bundle(_FILE, _PUB)
    except BundleError:
        return


def seeds() -> list[bytes]:
    out = _DIR / "seed.cvb"
    m = write_bundle(out, BASE, {"model.onnx": b"\x08\x07" * 100, "sample/inputs.npz": b"abc"}, _KEY)
    buf = io.BytesIO()
    buf.write(out.read_bytes())
    return [b"\x00" + m.to_bytes(), b"\x01" + buf.getvalue()]


if __name__ == "__main__":
    main(test_one_input, seeds)
    sys.exit(0)
