"""Issue #13, items 10 and 11: one safe-name rule at every door; nothing written before it holds.

Hostile bundles here are signed with a real key (an attacker who holds one, or a careless
recipe), built member by member as ``write_bundle`` would, because ``write_bundle`` itself now
refuses to sign them.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from cuvil_edge.bundle import extract_bundle, load_secret_key, read_manifest, verify_bundle, write_bundle
from cuvil_edge.bundle.names import check_component, is_safe_component
from cuvil_edge.bundle.signing import sign_bytes
from cuvil_edge.daemon.store import BundleStore
from cuvil_edge.errors import BundleError, SignatureError

BASE = {
    "format": "cuvil-bundle/1", "name": "tiny", "version": "1.0.0", "target": {"name": "x86-host"},
    "precision": "fp32", "format_kind": "ort-cpu", "model": "model.onnx", "inputs": [], "outputs": [],
}
MODEL = os.urandom(3000)


def _forge(out: Path, manifest: dict, key: Path, members: dict[str, bytes] | None = None,
           raw_manifest: bytes | None = None, signature: bytes | None = None) -> Path:
    """A bundle whose manifest is whatever we say, validly signed by ``key`` unless told otherwise."""
    members = {"model.onnx": MODEL} if members is None else members
    doc = dict(manifest)
    doc["files"] = [{"path": k, "sha256": hashlib.sha256(v).hexdigest(), "size": len(v)} for k, v in members.items()]
    data = raw_manifest if raw_manifest is not None else (json.dumps(doc, indent=2) + "\n").encode()
    sig = signature if signature is not None else sign_bytes(data, load_secret_key(key), "forged").encode()
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, blob in [("manifest.json", data), ("manifest.json.minisig", sig), *members.items()]:
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return out


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


class TestRule:
    @pytest.mark.parametrize("value", ["digits", "efficientnet-lite0", "1.0.0", "2.0.0+build.7", "a_b", "9"])
    def test_safe(self, value):
        assert is_safe_component(value) and check_component("name", value) == value

    @pytest.mark.parametrize("value", ["", ".", "..", "../x", "a/b", "a\\b", ".hidden", "-rf", "current",
                                       "previous", "current.new", "x.part", "a b", "é", "x" * 129, "a\x00b",
                                       None, 7, ["a"]])
    def test_unsafe(self, value):
        assert not is_safe_component(value)
        with pytest.raises(BundleError, match="not a safe directory name"):
            check_component("version", value)

    def test_message_stays_short_for_huge_values(self):
        with pytest.raises(BundleError) as info:
            check_component("name", "y" * 19_000)
        assert len(str(info.value)) < 400 and "19000 chars" in str(info.value)


class TestEscapingNames:
    @pytest.mark.parametrize("field", ["name", "version"])
    def test_signed_traversal_is_refused_by_verify_extract_and_store(self, tmp_path, keypair, cli, field):
        cvb = _forge(tmp_path / "evil.cvb", {**BASE, field: "../../../../var/escaped"}, keypair[0])
        with pytest.raises(BundleError, match="not a safe directory name"):
            verify_bundle(cvb, keypair[1])
        with pytest.raises(BundleError, match="not a safe directory name"):
            read_manifest(cvb)
        with pytest.raises(BundleError, match="not a safe directory name"):
            extract_bundle(cvb, tmp_path / "x" / "dest", keypair[1])
        root = tmp_path / "deep" / "a" / "b" / "c" / "store"
        root.mkdir(parents=True)
        before = _tree(tmp_path)
        with pytest.raises(BundleError, match="not a safe directory name"):
            BundleStore(root).install(cvb, public_key=keypair[1])
        assert _tree(tmp_path) == before, "install wrote something"
        result = cli("verify", str(cvb), "--pub", str(keypair[1]))
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert "not a safe directory name" in result.stderr and len(result.stderr.strip().splitlines()) <= 3

    def test_write_bundle_refuses_to_sign_it(self, tmp_path, keypair):
        with pytest.raises(BundleError, match="not a safe directory name"):
            write_bundle(tmp_path / "x.cvb", {**BASE, "name": "../escaped"}, {"model.onnx": MODEL}, keypair[0])
        assert not (tmp_path / "x.cvb").exists()


class TestStoreInstallNeedsTrust:
    def _good(self, tmp_path: Path, keypair) -> Path:
        return _forge(tmp_path / "good.cvb", BASE, keypair[0])

    def test_no_key_is_refused_unless_allowed(self, tmp_path, keypair):
        root = tmp_path / "store"
        root.mkdir()
        cvb = self._good(tmp_path, keypair)
        with pytest.raises(SignatureError, match="needs the signer's public key"):
            BundleStore(root).install(cvb)
        assert _tree(root) == set()
        assert BundleStore(root).install(cvb, allow_unsigned=True) == ("tiny", "1.0.0")

    def test_good_key_installs(self, tmp_path, keypair):
        root = tmp_path / "store"
        root.mkdir()
        assert BundleStore(root).install(self._good(tmp_path, keypair), public_key=keypair[1]) == ("tiny", "1.0.0")
        assert (root / "bundles" / "tiny" / "1.0.0" / "model.onnx").read_bytes() == MODEL

    @pytest.mark.parametrize("attack", ["wrong-key", "edited-manifest", "garbage-signature"])
    def test_untrusted_bundles_write_nothing(self, tmp_path, keypair, other_keypair, attack):
        root = tmp_path / "store"
        root.mkdir()
        if attack == "wrong-key":
            cvb = _forge(tmp_path / "a.cvb", BASE, other_keypair[0])
        elif attack == "edited-manifest":
            good = (json.dumps({**BASE, "files": [{"path": "model.onnx", "sha256": hashlib.sha256(MODEL).hexdigest(),
                                                   "size": len(MODEL)}]}, indent=2) + "\n").encode()
            sig = sign_bytes(good, load_secret_key(keypair[0]), "x").encode()
            cvb = _forge(tmp_path / "a.cvb", {**BASE, "precision": "int8"}, keypair[0], signature=sig)
        else:
            cvb = _forge(tmp_path / "a.cvb", BASE, keypair[0], signature=b"untrusted comment: x\nAAAA\n")
        with pytest.raises(SignatureError):
            BundleStore(root).install(cvb, public_key=keypair[1])
        assert _tree(root) == set(), "an untrusted bundle wrote into the store"

    def test_directory_install_checks_names(self, tmp_path):
        src = tmp_path / "src"
        src.mkdir()
        (src / "manifest.json").write_text(json.dumps({**BASE, "version": "../../../escaped"}))
        root = tmp_path / "store"
        root.mkdir()
        with pytest.raises(BundleError, match="not a safe directory name"):
            BundleStore(root).install(src, allow_unsigned=True)
        assert _tree(root) == set()


class TestDemoInstaller:
    def test_nothing_is_deleted_before_the_signature_verifies(self, tmp_path, keypair, other_keypair):
        from cuvil_edge.demo import _install

        store = tmp_path / "store"
        keep = store / "bundles" / "tiny" / "1.0.0"
        keep.mkdir(parents=True)
        (keep / "model.onnx").write_bytes(b"the user's model")
        cvb = _forge(tmp_path / "a.cvb", BASE, other_keypair[0])
        with pytest.raises(SignatureError):
            _install(cvb, store, keypair[1])
        assert (keep / "model.onnx").read_bytes() == b"the user's model"
        installed = _install(_forge(tmp_path / "b.cvb", BASE, keypair[0]), store, keypair[1])
        assert (installed / "model.onnx").read_bytes() == MODEL
        assert os.readlink(store / "bundles" / "tiny" / "current") == "1.0.0"


class TestVerifyNeverTracebacks:
    @pytest.mark.parametrize("manifest, message", [
        (b"[" * 30_000 + b"]" * 30_000, "nests too deeply"),
        (None, "max_batch"),
        ("preprocess", "preprocess"),
        ("files", "files[0]"),
        (b"\xff\xfe", "not valid JSON"),
    ])
    def test_one_line_and_exit_1(self, tmp_path, keypair, cli, manifest, message):
        if manifest is None:
            cvb = _forge(tmp_path / "m.cvb", {**BASE, "max_batch": "abc"}, keypair[0])
        elif manifest == "preprocess":
            cvb = _forge(tmp_path / "m.cvb", {**BASE, "preprocess": [1, 2]}, keypair[0])
        elif manifest == "files":
            data = json.dumps({**BASE, "files": [["model.onnx"]]}).encode()
            cvb = _forge(tmp_path / "m.cvb", BASE, keypair[0], raw_manifest=data)
        else:
            cvb = _forge(tmp_path / "m.cvb", BASE, keypair[0], raw_manifest=manifest)
        result = cli("verify", str(cvb), "--pub", str(keypair[1]))
        assert result.returncode == 1, result
        assert "Traceback" not in result.stderr and message in result.stderr, result.stderr


class TestPackageRefusesUnsafeNames:
    @pytest.mark.parametrize("flag, value", [("--name", "../../../escaped"), ("--version", "../x"),
                                             ("--name", "current")])
    def test_exit_1_before_any_work(self, tmp_path, keypair, cli, flag, value):
        out = tmp_path / "out" / "x.cvb"
        out.parent.mkdir()
        result = cli("package", "builtin:digits-cnn", "--target", "x86-host", "--out", str(out),
                     "--key", str(keypair[0]), flag, value, timeout=120)
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert "not a safe directory name" in result.stderr
        assert list(out.parent.iterdir()) == []
