"""Bundle container: signing interop with stock minisign, integrity, and hostile archives."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from cuvil_edge.bundle import (
    Manifest,
    extract_bundle,
    generate_keypair,
    load_public_key,
    load_secret_key,
    read_manifest,
    verify_bundle,
    verify_directory,
    write_bundle,
)
from cuvil_edge.bundle.signing import sign_bytes, verify_signature
from cuvil_edge.errors import BundleError, SignatureError

MINISIGN = shutil.which("minisign")
needs_minisign = pytest.mark.skipif(MINISIGN is None, reason="minisign not installed (scripts/bootstrap.sh test installs it)")

BASE = {
    "name": "tiny", "version": "1.0.0", "target": {"name": "x86-host"}, "precision": "fp32",
    "format_kind": "ort-cpu", "model": "model.onnx", "inputs": [], "outputs": [],
}


@pytest.fixture
def bundle(tmp_path: Path, keypair) -> Path:
    out = tmp_path / "tiny.cvb"
    write_bundle(out, BASE, {"model.onnx": os.urandom(5000), "sample/inputs.npz": b"abc"}, keypair[0])
    return out


def _rewrite(src: Path, dst: Path, mutate) -> None:
    """Copy a bundle member by member, letting ``mutate(info, data)`` change or add members."""
    with tarfile.open(src) as tin, tarfile.open(dst, "w", format=tarfile.PAX_FORMAT) as tout:
        for info in tin.getmembers():
            data = tin.extractfile(info).read()
            for new_info, new_data in mutate(info, data):
                tout.addfile(new_info, io.BytesIO(new_data) if new_data is not None else None)


class TestSigning:
    @needs_minisign
    def test_stock_minisign_verifies_our_manifest(self, bundle, keypair, tmp_path):
        dest = tmp_path / "x"
        extract_bundle(bundle, dest, keypair[1])
        r = subprocess.run([MINISIGN, "-V", "-p", str(keypair[1]), "-m", str(dest / "manifest.json")],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert "cuvil-bundle tiny 1.0.0" in r.stdout

    @needs_minisign
    def test_stock_minisign_rejects_a_changed_manifest(self, bundle, keypair, tmp_path):
        dest = tmp_path / "x"
        extract_bundle(bundle, dest, keypair[1])
        (dest / "manifest.json").write_text((dest / "manifest.json").read_text().replace("tiny", "tinz"))
        r = subprocess.run([MINISIGN, "-V", "-p", str(keypair[1]), "-m", str(dest / "manifest.json")],
                           capture_output=True, text=True)
        assert r.returncode != 0

    @needs_minisign
    def test_minisign_signs_with_our_key_and_we_read_its_keys(self, tmp_path, keypair):
        msg = tmp_path / "m"
        msg.write_bytes(b"payload")
        subprocess.run([MINISIGN, "-S", "-s", str(keypair[0]), "-m", str(msg), "-t", "tc"], check=True,
                       capture_output=True, input="")
        assert verify_signature(b"payload", (tmp_path / "m.minisig").read_text(), load_public_key(keypair[1])) == "tc"
        subprocess.run([MINISIGN, "-G", "-W", "-p", str(tmp_path / "mk.pub"), "-s", str(tmp_path / "mk.key")],
                       check=True, capture_output=True)
        sig = sign_bytes(b"x", load_secret_key(tmp_path / "mk.key"), "c")
        (tmp_path / "x").write_bytes(b"x")
        (tmp_path / "x.minisig").write_text(sig)
        r = subprocess.run([MINISIGN, "-V", "-p", str(tmp_path / "mk.pub"), "-m", str(tmp_path / "x")],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr

    def test_wrong_key_is_refused_and_named(self, bundle, other_keypair):
        with pytest.raises(SignatureError, match="wrong key"):
            verify_bundle(bundle, other_keypair[1])

    def test_keygen_refuses_to_overwrite(self, keypair):
        with pytest.raises(SignatureError, match="refusing to overwrite"):
            generate_keypair(keypair[0], keypair[1])
        assert oct(keypair[0].stat().st_mode & 0o777) == "0o600"

    def test_garbage_key_file(self, tmp_path):
        bad = tmp_path / "bad.key"
        bad.write_text("hello\n")
        with pytest.raises(SignatureError, match="bad.key"):
            load_secret_key(bad)


class TestIntegrity:
    def test_round_trip(self, bundle, keypair, tmp_path):
        m = verify_bundle(bundle, keypair[1])
        assert isinstance(m, Manifest) and {f.path for f in m.files} == {"model.onnx", "sample/inputs.npz"}
        assert read_manifest(bundle).name == "tiny"
        with tarfile.open(bundle) as t:
            assert t.getnames()[:2] == ["manifest.json", "manifest.json.minisig"]
        dest = tmp_path / "out"
        extract_bundle(bundle, dest, keypair[1])
        assert verify_directory(dest, keypair[1]).version == "1.0.0"

    def test_flipped_payload_byte(self, bundle, tmp_path):
        def mutate(info, data):
            if info.name == "model.onnx":
                data = bytes([data[0] ^ 1]) + data[1:]
            yield info, data

        bad = tmp_path / "bad.cvb"
        _rewrite(bundle, bad, mutate)
        with pytest.raises(BundleError, match="checksum mismatch for 'model.onnx'"):
            verify_bundle(bad)

    def test_truncated_bundle(self, bundle, tmp_path):
        bad = tmp_path / "trunc.cvb"
        bad.write_bytes(bundle.read_bytes()[: bundle.stat().st_size // 2])
        with pytest.raises(BundleError, match="trunc"):
            verify_bundle(bad)

    def test_not_a_bundle(self, tmp_path):
        bad = tmp_path / "x.cvb"
        bad.write_text("hello")
        with pytest.raises(BundleError, match="not a cuvil-edge bundle"):
            verify_bundle(bad)

    @pytest.mark.parametrize("attack", ["traversal", "absolute", "symlink", "hardlink", "extra", "device"])
    def test_hostile_members_are_refused_and_nothing_is_left(self, bundle, tmp_path, attack):
        def mutate(info, data):
            yield info, data
            if info.name != "manifest.json.minisig":
                return
            evil = tarfile.TarInfo({"traversal": "../evil", "absolute": "/tmp/evil", "extra": "extra.bin"}.get(
                attack, "link"))
            if attack == "symlink":
                evil.type, evil.linkname = tarfile.SYMTYPE, "/etc/passwd"
                yield evil, None
            elif attack == "hardlink":
                evil.type, evil.linkname = tarfile.LNKTYPE, "model.onnx"
                yield evil, None
            elif attack == "device":
                evil.type = tarfile.CHRTYPE
                yield evil, None
            else:
                evil.size = 4
                yield evil, b"evil"

        bad = tmp_path / "evil.cvb"
        _rewrite(bundle, bad, mutate)
        dest = tmp_path / "dest"
        with pytest.raises(BundleError):
            extract_bundle(bad, dest)
        assert not dest.exists()
        assert not (tmp_path / "evil").exists()
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".dest")] == []

    def test_extract_refuses_existing_destination(self, bundle, tmp_path):
        dest = tmp_path / "dest"
        dest.mkdir()
        (dest / "keep").write_text("mine")
        with pytest.raises(BundleError, match="already exists"):
            extract_bundle(bundle, dest)
        assert (dest / "keep").read_text() == "mine"

    def test_directory_with_unlisted_file(self, bundle, tmp_path):
        dest = tmp_path / "d"
        extract_bundle(bundle, dest)
        (dest / "dropped.so").write_bytes(b"x")
        with pytest.raises(BundleError, match="dropped.so"):
            verify_directory(dest)

    def test_failed_write_keeps_the_old_file(self, tmp_path, keypair):
        out = tmp_path / "b.cvb"
        out.write_bytes(b"previous")
        with pytest.raises(BundleError):
            write_bundle(out, BASE, {"model.onnx": tmp_path / "missing.onnx"}, keypair[0])
        assert out.read_bytes() == b"previous"
        assert [p.name for p in tmp_path.iterdir()] == ["b.cvb"]

    def test_resign_with_another_key(self, bundle, cli, other_keypair, keypair):
        r = cli("sign", str(bundle), "--key", str(other_keypair[0]))
        assert r.returncode == 0, r.stderr
        verify_bundle(bundle, other_keypair[1])
        with pytest.raises(SignatureError):
            verify_bundle(bundle, keypair[1])
