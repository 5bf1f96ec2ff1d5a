"""The ``.cvb`` container: one uncompressed POSIX tar, ``manifest.json`` first, its signature second.

Manifest first lets a device check the signature before it reads a payload byte and then verify
each member while streaming, without a seek; plain tar keeps bundles inspectable with stock tools.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import io
import os
import posixpath
import shutil
import tarfile
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from cuvil_edge import __version__
from cuvil_edge._atomic import atomic_output
from cuvil_edge.bundle.manifest import FORMAT, Manifest
from cuvil_edge.bundle.signing import (
    PublicKey,
    SecretKey,
    default_key_paths,
    generate_keypair,
    load_public_key,
    load_secret_key,
    sign_bytes,
    verify_signature,
)
from cuvil_edge.errors import BundleError, SignatureError

__all__ = [
    "MANIFEST_NAME",
    "SIGNATURE_NAME",
    "extract_bundle",
    "iter_member_bytes",
    "read_manifest",
    "resolve_secret_key",
    "verify_bundle",
    "verify_directory",
    "write_bundle",
]

MANIFEST_NAME = "manifest.json"
SIGNATURE_NAME = "manifest.json.minisig"
_MAX_MANIFEST = 4 * 1024 * 1024
_CHUNK = 1024 * 1024
# Files a device may keep beside an extracted bundle without failing verification.
_LOCAL_PREFIX = ".cuvil-"


def _sha256_file(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def _check_member_name(name: str, where: str) -> str:
    norm = posixpath.normpath(name)
    if (
        not name
        or name.startswith("/")
        or norm != name
        or norm == "."
        or norm.startswith("../")
        or norm == ".."
        or "\\" in name
        or "\x00" in name
    ):
        raise BundleError(f"{where}: unsafe member path '{name}' (absolute, '..' or not normalized)")
    return norm


def resolve_secret_key(secret_key: Path | SecretKey | None) -> SecretKey:
    """A SecretKey from a path, or the default key (created on first use, like minisign's)."""
    if isinstance(secret_key, SecretKey):
        return secret_key
    if secret_key is None:
        sk_path, pk_path = default_key_paths()
        if not sk_path.exists():
            generate_keypair(sk_path, pk_path)
        secret_key = sk_path
    return load_secret_key(Path(secret_key))


def _resolve_public_key(public_key: Path | PublicKey | None) -> PublicKey | None:
    if public_key is None or isinstance(public_key, PublicKey):
        return public_key
    return load_public_key(Path(public_key))


def _tarinfo(name: str, size: int, mtime: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = mtime
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def write_bundle(
    out: Path,
    manifest: Mapping[str, Any],
    members: Mapping[str, Path | bytes],
    secret_key: Path | SecretKey | None = None,
) -> Manifest:
    """Write a signed bundle atomically; fills ``files`` (sha256, size), ``format`` and ``created``.

    Args:
        out (Path): the ``.cvb`` to write; an existing file is replaced only on success.
        manifest (dict): manifest fields other than ``files``.
        members (dict[str, Path | bytes]): payload by path inside the bundle.
        secret_key (Path | SecretKey): signing key. Defaults to the user's default key.
    """
    key = resolve_secret_key(secret_key)
    entries: list[dict[str, Any]] = []
    for name in sorted(members):
        _check_member_name(name, str(out))
        if name in (MANIFEST_NAME, SIGNATURE_NAME):
            raise BundleError(f"{out}: payload may not be named '{name}'")
        data = members[name]
        if isinstance(data, bytes):
            digest, size = hashlib.sha256(data).hexdigest(), len(data)
        else:
            try:
                digest, size = _sha256_file(Path(data))
            except OSError as exc:
                raise BundleError(f"{data}: cannot read bundle member '{name}' ({exc.strerror})") from None
        entries.append({"path": name, "sha256": digest, "size": size})
    now = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)
    full = dict(manifest)
    full.update(
        {
            "format": FORMAT,
            "created": full.get("created") or now.isoformat(),
            "tool": f"cuvil-edge {__version__}",
            "key_id": key.public.key_id_hex,
            "files": entries,
        }
    )
    parsed = Manifest.from_dict(full, str(out))
    manifest_bytes = parsed.to_bytes()
    sig_text = sign_bytes(
        manifest_bytes,
        key,
        trusted_comment=(
            f"cuvil-bundle {parsed.name} {parsed.version} target={parsed.target_name} "
            f"sha256={hashlib.sha256(manifest_bytes).hexdigest()}"
        ),
    ).encode("utf-8")
    mtime = int(now.timestamp())
    with atomic_output(out) as f, tarfile.open(fileobj=f, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_tarinfo(MANIFEST_NAME, len(manifest_bytes), mtime), io.BytesIO(manifest_bytes))
        tar.addfile(_tarinfo(SIGNATURE_NAME, len(sig_text), mtime), io.BytesIO(sig_text))
        for entry in entries:
            data = members[entry["path"]]
            info = _tarinfo(entry["path"], entry["size"], mtime)
            if isinstance(data, bytes):
                tar.addfile(info, io.BytesIO(data))
            else:
                with open(data, "rb") as src:
                    tar.addfile(info, src)
    return parsed


@contextlib.contextmanager
def _open_stream(bundle: Path) -> Iterator[tarfile.TarFile]:
    try:
        f = open(bundle, "rb")
    except FileNotFoundError:
        raise BundleError(f"{bundle}: no such bundle") from None
    except OSError as exc:
        raise BundleError(f"{bundle}: cannot open bundle ({exc.strerror})") from None
    try:
        try:
            tar = tarfile.open(fileobj=f, mode="r|")
        except tarfile.TarError:
            raise BundleError(f"{bundle}: not a cuvil-edge bundle (not a tar archive)") from None
        with tar:
            yield tar
    finally:
        f.close()


def _read_small(tar: tarfile.TarFile, info: tarfile.TarInfo, bundle: Path) -> bytes:
    if not info.isreg():
        raise BundleError(f"{bundle}: member '{info.name}' is not a regular file")
    if info.size > _MAX_MANIFEST:
        raise BundleError(f"{bundle}: member '{info.name}' is too large ({info.size} bytes)")
    fobj = tar.extractfile(info)
    assert fobj is not None
    data = fobj.read()
    if len(data) != info.size:
        raise BundleError(f"{bundle}: truncated at member '{info.name}'")
    return data


def _head(tar: tarfile.TarFile, bundle: Path, public_key: PublicKey | None) -> tuple[Manifest, bytes, bytes]:
    """Read and check manifest and signature, the first two members."""
    try:
        first = tar.next()
        if first is None or first.name != MANIFEST_NAME:
            raise BundleError(f"{bundle}: not a cuvil-edge bundle (first member is not {MANIFEST_NAME})")
        manifest_bytes = _read_small(tar, first, bundle)
        second = tar.next()
        if second is None or second.name != SIGNATURE_NAME:
            raise SignatureError(f"{bundle}: bundle is not signed (no {SIGNATURE_NAME} after the manifest)")
        sig_bytes = _read_small(tar, second, bundle)
    except tarfile.TarError as exc:
        raise BundleError(f"{bundle}: corrupt or truncated bundle ({exc})") from None
    manifest = Manifest.from_bytes(manifest_bytes, f"{bundle}:{MANIFEST_NAME}")
    if public_key is not None:
        verify_signature(manifest_bytes, sig_bytes.decode("utf-8", "replace"), public_key, where=str(bundle))
    return manifest, manifest_bytes, sig_bytes


def read_manifest(bundle: Path, public_key: Path | PublicKey | None = None) -> Manifest:
    """The manifest of a bundle file (its name and version checked), reading only the head.

    With ``public_key`` the manifest's signature is verified too; the payload is not read.
    """
    with _open_stream(Path(bundle)) as tar:
        return _head(tar, Path(bundle), _resolve_public_key(public_key))[0]


def _copy_verified(src: IO[bytes], dst: IO[bytes] | None, expected_size: int) -> str:
    h = hashlib.sha256()
    left = expected_size
    while left > 0:
        chunk = src.read(min(_CHUNK, left))
        if not chunk:
            break
        h.update(chunk)
        if dst is not None:
            dst.write(chunk)
        left -= len(chunk)
    return h.hexdigest()


def _walk_payload(
    bundle: Path, public_key: Path | PublicKey | None, dest: Path | None
) -> tuple[Manifest, bytes, bytes]:
    key = _resolve_public_key(public_key)
    bundle = Path(bundle)
    with _open_stream(bundle) as tar:
        manifest, manifest_bytes, sig_bytes = _head(tar, bundle, key)
        expected = {f.path: f for f in manifest.files}
        seen: set[str] = set()
        try:
            # tar.next(), not iteration: iterating restarts at the members _head already read.
            while (info := tar.next()) is not None:
                name = _check_member_name(info.name, str(bundle))
                if not info.isreg():
                    kind = "link" if (info.issym() or info.islnk()) else "non-regular file"
                    raise BundleError(f"{bundle}: member '{name}' is a {kind}; bundles hold regular files only")
                if name not in expected:
                    raise BundleError(f"{bundle}: member '{name}' is not listed in the manifest")
                if name in seen:
                    raise BundleError(f"{bundle}: member '{name}' appears twice")
                entry = expected[name]
                if info.size != entry.size:
                    raise BundleError(f"{bundle}: member '{name}' is {info.size} bytes, manifest says {entry.size}")
                src = tar.extractfile(info)
                assert src is not None
                if dest is None:
                    digest = _copy_verified(src, None, info.size)
                else:
                    target = dest / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with open(target, "xb") as out:
                        digest = _copy_verified(src, out, info.size)
                        out.flush()
                        os.fsync(out.fileno())
                if digest != entry.sha256:
                    raise BundleError(f"{bundle}: checksum mismatch for '{name}' (corrupted or tampered)")
                seen.add(name)
        except tarfile.TarError as exc:
            raise BundleError(f"{bundle}: corrupt or truncated bundle ({exc})") from None
        missing = sorted(set(expected) - seen)
        if missing:
            raise BundleError(f"{bundle}: truncated or incomplete: missing member(s) {', '.join(missing)}")
    return manifest, manifest_bytes, sig_bytes


def verify_bundle(bundle: Path, public_key: Path | PublicKey | None = None) -> Manifest:
    """Check every member's size and sha256, no extra or missing members, and the signature.

    Without ``public_key`` only integrity is checked, not who signed it.
    """
    return _walk_payload(Path(bundle), public_key, None)[0]


def extract_bundle(bundle: Path, dest: Path, public_key: Path | PublicKey | None = None) -> Manifest:
    """Verify while extracting into a temp dir beside ``dest``, then rename it to ``dest``.

    Refuses path traversal, links, device files and members the manifest does not list; ``dest``
    must not exist, so nothing already there is touched.
    """
    dest = Path(dest)
    if dest.exists() or dest.is_symlink():
        raise BundleError(f"{dest}: already exists; refusing to extract over it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".extract", dir=dest.parent))
    try:
        manifest, manifest_bytes, sig_bytes = _walk_payload(Path(bundle), public_key, tmp)
        (tmp / MANIFEST_NAME).write_bytes(manifest_bytes)
        (tmp / SIGNATURE_NAME).write_bytes(sig_bytes)
        os.chmod(tmp, 0o755)
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def verify_directory(directory: Path, public_key: Path | PublicKey | None = None) -> Manifest:
    """The checks of :func:`verify_bundle` on an extracted bundle directory."""
    directory = Path(directory)
    key = _resolve_public_key(public_key)
    try:
        manifest_bytes = (directory / MANIFEST_NAME).read_bytes()
    except OSError:
        raise BundleError(f"{directory}: no {MANIFEST_NAME}; not an extracted bundle") from None
    manifest = Manifest.from_bytes(manifest_bytes, str(directory / MANIFEST_NAME))
    if key is not None:
        try:
            sig_text = (directory / SIGNATURE_NAME).read_text("utf-8", "replace")
        except OSError:
            raise SignatureError(f"{directory}: no {SIGNATURE_NAME}; bundle is not signed") from None
        verify_signature(manifest_bytes, sig_text, key, where=str(directory / SIGNATURE_NAME))
    expected = {f.path: f for f in manifest.files}
    present: set[str] = set()
    for root, dirs, files in os.walk(directory):
        for name in files + [d for d in dirs if (Path(root) / d).is_symlink()]:
            rel = os.path.relpath(os.path.join(root, name), directory)
            if rel in (MANIFEST_NAME, SIGNATURE_NAME) or rel.startswith(_LOCAL_PREFIX):
                continue
            path = Path(root) / name
            if path.is_symlink() or not path.is_file():
                raise BundleError(f"{directory}: '{rel}' is a link or special file")
            if rel not in expected:
                raise BundleError(f"{directory}: '{rel}' is not listed in the manifest")
            digest, size = _sha256_file(path)
            if size != expected[rel].size or digest != expected[rel].sha256:
                raise BundleError(f"{directory}: checksum mismatch for '{rel}'")
            present.add(rel)
    missing = sorted(set(expected) - present)
    if missing:
        raise BundleError(f"{directory}: missing member(s) {', '.join(missing)}")
    return manifest


def iter_member_bytes(bundle: Path, names: set[str]) -> Iterator[tuple[str, bytes]]:
    """Yield (name, bytes) of selected small members, in bundle order, without verifying."""
    with _open_stream(Path(bundle)) as tar:
        for info in tar:
            if info.name in names and info.isreg():
                fobj = tar.extractfile(info)
                assert fobj is not None
                yield info.name, fobj.read()
