"""Ed25519 keys and signatures in minisign's formats, so the stock ``minisign`` tool interoperates.

Formats (https://jedisct1.github.io/minisign/): the public key is base64 of ``"Ed" || key_id[8] ||
pk[32]``; the secret key is base64 of ``"Ed" || kdf[2] || "B2" || salt[32] || opslimit[8] ||
memlimit[8] || key_id[8] || sk[64] || blake2b-256 checksum[32]``, the last 104 bytes XOR-encrypted
with a scrypt stream unless ``kdf`` is two zero bytes (``minisign -W``). Signatures are pre-hashed
(``"ED"``: Ed25519 over BLAKE2b-512 of the data) with a second, global signature over the first one
and the trusted comment.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import struct
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from cuvil_edge._atomic import atomic_write_text
from cuvil_edge.errors import SignatureError

__all__ = [
    "PublicKey",
    "SecretKey",
    "default_key_paths",
    "generate_keypair",
    "load_public_key",
    "load_secret_key",
    "sign_bytes",
    "verify_signature",
]

_UNTRUSTED = "untrusted comment: "
_TRUSTED = "trusted comment: "
_KDF_NONE = b"\x00\x00"
_KDF_SCRYPT = b"Sc"
PASSWORD_ENV = "CUVIL_EDGE_KEY_PASSWORD"


@dataclass(frozen=True)
class PublicKey:
    """An Ed25519 public key with its 8-byte minisign key id."""

    key_id: bytes
    key: Ed25519PublicKey

    @property
    def key_id_hex(self) -> str:
        return f"{struct.unpack('<Q', self.key_id)[0]:016X}"


@dataclass(frozen=True)
class SecretKey:
    """An Ed25519 secret key with its key id."""

    key_id: bytes
    key: Ed25519PrivateKey

    @property
    def public(self) -> PublicKey:
        return PublicKey(self.key_id, self.key.public_key())


def default_key_paths() -> tuple[Path, Path]:
    """Default secret and public key paths (``~/.config/cuvil-edge/keys/``), like minisign's ``~/.minisign``."""
    base = Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config")) / "cuvil-edge" / "keys"
    return base / "cuvil.key", base / "cuvil.pub"


def _raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def _read_b64_lines(path: Path, what: str) -> list[str]:
    try:
        text = path.read_text("utf-8")
    except FileNotFoundError:
        raise SignatureError(f"{path}: {what} not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SignatureError(f"{path}: cannot read {what}: {exc}") from exc
    return [line.strip() for line in text.splitlines() if line.strip()]


def _b64(data: str, path: Path, what: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except ValueError:
        raise SignatureError(f"{path}: {what} is not valid base64") from None


def generate_keypair(secret_path: Path, public_path: Path, *, overwrite: bool = False) -> PublicKey:
    """Write a new unencrypted key pair (as ``minisign -GW`` does). The secret key gets mode 0600.

    Refuses to overwrite existing keys unless ``overwrite``: losing a signing key orphans every
    device that trusts it.
    """
    for path in (secret_path, public_path):
        if path.exists() and not overwrite:
            raise SignatureError(f"{path}: already exists; refusing to overwrite a key (pass --force)")
    sk = Ed25519PrivateKey.generate()
    key_id = secrets.token_bytes(8)
    seed = sk.private_bytes_raw()
    pk = _raw_public(sk.public_key())
    sk64 = seed + pk
    chk = hashlib.blake2b(b"Ed" + key_id + sk64, digest_size=32).digest()
    blob = b"Ed" + _KDF_NONE + b"B2" + bytes(32) + bytes(8) + bytes(8) + key_id + sk64 + chk
    public = PublicKey(key_id, sk.public_key())
    atomic_write_text(
        secret_path, f"{_UNTRUSTED}cuvil-edge secret key {public.key_id_hex}\n{base64.b64encode(blob).decode()}\n",
        mode=0o600,
    )
    atomic_write_text(
        public_path,
        f"{_UNTRUSTED}minisign public key {public.key_id_hex}\n{base64.b64encode(b'Ed' + key_id + pk).decode()}\n",
    )
    return public


def _scrypt_stream(password: bytes, salt: bytes, opslimit: int, memlimit: int, length: int) -> bytes:
    """libsodium's crypto_pwhash_scryptsalsa208sha256 parameter choice, then scrypt."""
    opslimit = max(opslimit, 32768)
    r = 8
    if opslimit < memlimit // 32:
        p = 1
        max_n = opslimit // (r * 4)
    else:
        max_n = memlimit // (r * 128)
    n_log2 = 1
    while n_log2 < 63 and (1 << n_log2) <= max_n // 2:
        n_log2 += 1
    if not opslimit < memlimit // 32:
        maxrp = min((opslimit // 4) // (1 << n_log2), 0x3FFFFFFF)
        p = maxrp // r
    n = 1 << n_log2
    return hashlib.scrypt(password, salt=salt, n=n, r=r, p=p, maxmem=min(2**31 - 1, 128 * r * (n + p) + 2**26), dklen=length)


def load_secret_key(path: Path, password: str | None = None) -> SecretKey:
    """Read a minisign secret key; encrypted keys need ``password`` or ``$CUVIL_EDGE_KEY_PASSWORD``."""
    lines = _read_b64_lines(path, "secret key")
    if len(lines) < 2 or not lines[0].startswith(_UNTRUSTED):
        raise SignatureError(f"{path}: not a minisign secret key (expected a comment line and a base64 line)")
    blob = _b64(lines[1], path, "secret key")
    if len(blob) != 158 or blob[:2] != b"Ed" or blob[4:6] != b"B2":
        raise SignatureError(f"{path}: not a minisign Ed25519 secret key (wrong length or algorithm)")
    kdf, salt = blob[2:4], blob[6:38]
    opslimit, memlimit = struct.unpack("<QQ", blob[38:54])
    keynum_sk = blob[54:158]
    if kdf == _KDF_SCRYPT:
        password = password if password is not None else os.environ.get(PASSWORD_ENV)
        if password is None:
            raise SignatureError(f"{path}: key is encrypted; set ${PASSWORD_ENV} to its password")
        stream = _scrypt_stream(password.encode(), salt, opslimit, memlimit, len(keynum_sk))
        keynum_sk = bytes(a ^ b for a, b in zip(keynum_sk, stream, strict=True))
    elif kdf != _KDF_NONE:
        raise SignatureError(f"{path}: unknown key derivation '{kdf!r}'")
    key_id, sk64, chk = keynum_sk[:8], keynum_sk[8:72], keynum_sk[72:104]
    # minisign -W (0.11) leaves the checksum of an unencrypted key all zero.
    unchecked = kdf == _KDF_NONE and chk == bytes(32)
    if not unchecked and hashlib.blake2b(b"Ed" + key_id + sk64, digest_size=32).digest() != chk:
        hint = "wrong password" if kdf == _KDF_SCRYPT else "file is corrupted"
        raise SignatureError(f"{path}: secret key checksum mismatch ({hint})")
    sk = Ed25519PrivateKey.from_private_bytes(sk64[:32])
    if _raw_public(sk.public_key()) != sk64[32:]:
        raise SignatureError(f"{path}: secret key is inconsistent (public half does not match)")
    return SecretKey(key_id, sk)


def load_public_key(path: Path) -> PublicKey:
    """Read a minisign public key file (comment line + base64 line, or the bare base64 line)."""
    lines = _read_b64_lines(path, "public key")
    data = [line for line in lines if not line.startswith(_UNTRUSTED)]
    if not data:
        raise SignatureError(f"{path}: not a minisign public key (no key line)")
    blob = _b64(data[0], path, "public key")
    if len(blob) != 42 or blob[:2] != b"Ed":
        raise SignatureError(f"{path}: not a minisign Ed25519 public key (wrong length or algorithm)")
    return PublicKey(blob[2:10], Ed25519PublicKey.from_public_bytes(blob[10:42]))


def sign_bytes(data: bytes, secret_key: SecretKey, trusted_comment: str, untrusted_comment: str = "") -> str:
    """Sign ``data``; returns the text of a ``.minisig`` file that ``minisign -V`` accepts."""
    if "\n" in trusted_comment or "\r" in trusted_comment:
        raise SignatureError("trusted comment must be a single line")
    digest = hashlib.blake2b(data, digest_size=64).digest()
    sig = secret_key.key.sign(digest)
    global_sig = secret_key.key.sign(sig + trusted_comment.encode("utf-8"))
    comment = untrusted_comment or f"signature from cuvil-edge secret key {secret_key.public.key_id_hex}"
    return (
        f"{_UNTRUSTED}{comment}\n{base64.b64encode(b'ED' + secret_key.key_id + sig).decode()}\n"
        f"{_TRUSTED}{trusted_comment}\n{base64.b64encode(global_sig).decode()}\n"
    )


def verify_signature(data: bytes, minisig_text: str, public_key: PublicKey, *, where: str = "signature") -> str:
    """Check a ``.minisig`` over ``data``; returns the trusted comment. Raises SignatureError."""
    lines = [line.rstrip("\r") for line in minisig_text.splitlines()]
    if len(lines) < 4 or not lines[0].startswith(_UNTRUSTED) or not lines[2].startswith(_TRUSTED):
        raise SignatureError(f"{where}: not a minisign signature (expected 4 lines)")
    sig_blob = _b64(lines[1], Path(where), "signature")
    if len(sig_blob) != 74 or sig_blob[:2] not in (b"ED", b"Ed"):
        raise SignatureError(f"{where}: unsupported signature algorithm or length")
    if sig_blob[2:10] != public_key.key_id:
        other = f"{struct.unpack('<Q', sig_blob[2:10])[0]:016X}"
        raise SignatureError(
            f"{where}: signed by key {other}, but the public key given is {public_key.key_id_hex} (wrong key)"
        )
    sig = sig_blob[10:]
    message = hashlib.blake2b(data, digest_size=64).digest() if sig_blob[:2] == b"ED" else data
    trusted = lines[2][len(_TRUSTED):]
    global_sig = _b64(lines[3], Path(where), "global signature")
    try:
        public_key.key.verify(sig, message)
    except InvalidSignature:
        raise SignatureError(f"{where}: signature does not match the data (tampered or wrong key)") from None
    try:
        public_key.key.verify(global_sig, sig + trusted.encode("utf-8"))
    except InvalidSignature:
        raise SignatureError(f"{where}: trusted comment was altered") from None
    return trusted
