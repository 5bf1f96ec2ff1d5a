"""Where built engines live, on a device and on a host, and how one is trusted.

An engine is never inside the signed bundle: it is built on (or for) one device key after the
bundle was signed. So it carries its own record, and whoever uses it checks that record:

    <root>/<engine key>/<model sha256>.plan    the serialized engine
    <root>/<engine key>/<model sha256>.json    its record (written last: a plan without a record
                                               is an unfinished write and is ignored)
    <root>/<engine key>/<model sha256>.log     the builder's log
    <root>/<engine key>/timing.cache           the TensorRT timing cache of that key

``<root>`` is ``<store>/engines`` on a device and ``~/.cache/cuvil-edge/engines`` on a host
(``$CUVIL_EDGE_ENGINE_CACHE``, else ``$CUVIL_EDGE_CACHE/engines``). The record holds the key,
the model's sha256, the plan's sha256 and size, the builder (``tensorrt`` or ``standin``) and the
sha256 of the builder log. :meth:`EngineStore.verify` refuses an engine whose record names another
key or another model, or whose plan bytes do not hash to the record's: the daemon then serves
the bundle with ONNX Runtime and says why.

A record is read from disk, where anything may have happened to it, so reading it never trusts
it: at most :data:`MAX_RECORD_BYTES`, JSON whose nesting the parser survives, and a schema check
of every field's type before use (:class:`RecordInvalid` otherwise, which the daemon answers by
quarantining the file once, :meth:`EngineStore.quarantine`, and serving ONNX Runtime). A record,
plan or key directory that is a symlink, or that resolves outside the store's root, is refused:
the hash check proves the bytes, not that the store owns them.

This layout is a host-device contract, so it lives in the bundle package, below the packager,
deploy and the runtime (none of them import each other for it).

:func:`key_for_facts` is the one place where a device's facts (module, L4T, TensorRT, SM of its
board profile) and a build plan (DLA core, plan digest) become an
:class:`~cuvil_edge.bundle.engine_key.EngineKey`: the host (over SSH), the device's builder and the
daemon all call it. The timing cache sits in the key's directory, so it is keyed the same way: an
Orin Nano's cache never reaches an AGX Orin.
"""

from __future__ import annotations

import datetime as _dt
import errno
import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cuvil_edge._atomic import atomic_write_bytes, atomic_write_text
from cuvil_edge._cache import cache_dir
from cuvil_edge.bundle.engine_key import EngineKey, engine_cache_key, major_minor, plan_digest
from cuvil_edge.errors import ModelError

__all__ = [
    "MAX_RECORD_BYTES",
    "RECORD_FORMAT",
    "EngineError",
    "EngineRecord",
    "DeviceIdentity",
    "EngineStore",
    "RecordInvalid",
    "device_identity",
    "host_engine_cache",
    "key_for_facts",
    "plan_matches_device",
    "sha256_bytes",
    "sha256_file",
]

RECORD_FORMAT = "cuvil-engine-record/1"
MAX_RECORD_BYTES = 64 << 10  # a record is a few hundred bytes; a larger file is not one
_SHA = re.compile(r"[0-9a-f]{64}")


class EngineError(ModelError):
    """An engine that cannot be used here: no key for this device, wrong model, corrupt plan."""


class RecordInvalid(EngineError):
    """A record file that is not a record: unreadable, too large, too deep, or a field of the wrong type."""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class DeviceIdentity:
    """What a device contributes to an engine key: its module, L4T, TensorRT and GPU SM."""

    module: str
    l4t: str
    tensorrt: str
    sm: str


def device_identity(facts: Any, tensorrt: str | None = None) -> DeviceIdentity:
    """A device's part of its engine keys, from its facts (``cuvil_edge.deploy.probe.DeviceFacts``).

    Args:
        facts: the device's facts (``l4t``, ``tensorrt``, ``profile``).
        tensorrt (str | None): the TensorRT version actually importable, when it is known and may
            differ from the dpkg package (a pip-installed TensorRT). Defaults to the facts'.

    Raises:
        EngineError: the device shows no L4T, no TensorRT or no GPU profile.
    """
    from cuvil_edge.targets import get_target

    trt = tensorrt or getattr(facts, "tensorrt", None)
    l4t = getattr(facts, "l4t", None)
    profile = getattr(facts, "profile", None)
    target = None
    if profile:
        try:
            target = get_target(profile)
        except Exception:  # noqa: BLE001 - an unknown profile has no SM we can name
            target = None
    sm = target.gpu_sm if target is not None else ""
    if not l4t or not trt or not sm or target is None:
        raise EngineError(f"no engine key for this device: L4T {l4t or 'none'}, TensorRT {trt or 'none'}, "
                          f"GPU SM {sm or 'none'} (board profile {profile or 'unknown'}); engines need a Jetson "
                          "with JetPack's TensorRT")
    return DeviceIdentity(target.module, str(l4t), ".".join(str(trt).split(".")[:3]), sm)


def plan_matches_device(plan: Mapping[str, Any], device: DeviceIdentity, dla_core: int | None = None) -> bool:
    """Whether a build plan can be built on this device: same TensorRT major.minor, SM and DLA core.

    The module is not compared: a plan made for one Orin module builds on another (the engine key
    then names the module it was built on).
    """
    pkey = plan.get("engine_key") or {}
    return (major_minor(str(pkey.get("tensorrt"))) == major_minor(device.tensorrt)
            and str(pkey.get("sm")) == device.sm and pkey.get("dla_core") == dla_core)


def key_for_facts(facts: Any, plan: Mapping[str, Any], tensorrt: str | None = None) -> EngineKey:
    """The key of the engine this device builds (or serves) from ``plan``.

    The one place where a device's facts become an :class:`EngineKey`: module, L4T, TensorRT and
    SM from the device (:func:`device_identity`), DLA core and plan digest from the plan, so an
    engine made for another module or another plan is never looked up under this key.

    Args:
        facts: the device's facts.
        plan (Mapping[str, Any]): the bundle's build plan for this device.
        tensorrt (str | None): see :func:`device_identity`.

    Raises:
        EngineError: no key for this device (see :func:`device_identity`).
    """
    ident = device_identity(facts, tensorrt)
    core = (plan.get("dla") or {}).get("core")
    return engine_cache_key(ident.module, ident.l4t, ident.tensorrt, ident.sm, core, plan_digest(plan))


@dataclass
class EngineRecord:
    """What is known about one stored engine (the ``.json`` beside the plan)."""

    key: EngineKey
    model_sha256: str
    plan_sha256: str
    plan_size: int
    builder: str
    builder_version: str = ""
    builder_log_sha256: str = ""
    precision: str = ""
    plugins: list[str] = field(default_factory=list)
    built_at: str = ""
    built_on: str = ""

    @property
    def is_standin(self) -> bool:
        """Made by the stand-in builder (tests without TensorRT), not by TensorRT."""
        return self.builder == "standin"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["key"] = self.key.to_dict()
        out["key_slug"] = self.key.slug
        out["format"] = RECORD_FORMAT
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "engine record") -> EngineRecord:
        """A record from its JSON form, every field's type checked first.

        Raises:
            RecordInvalid: not a record of this format, or a field missing or of the wrong type.
        """
        if not isinstance(data, Mapping) or data.get("format") != RECORD_FORMAT:
            raise RecordInvalid(f"{where}: not a {RECORD_FORMAT} record")
        key = data.get("key")
        if not isinstance(key, Mapping) or not all(isinstance(v, (str, int)) or v is None for v in key.values()):
            raise RecordInvalid(f"{where}: field key must be an object of strings, got {type(key).__name__}")
        for name in ("model_sha256", "plan_sha256", "builder"):
            if not isinstance(data.get(name), str):
                raise RecordInvalid(f"{where}: field {name} must be a string")
        for name in ("builder_version", "builder_log_sha256", "precision", "built_at", "built_on"):
            if not isinstance(data.get(name, ""), str):
                raise RecordInvalid(f"{where}: field {name} must be a string")
        size = data.get("plan_size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise RecordInvalid(f"{where}: field plan_size must be a non-negative integer")
        plugins = data.get("plugins") or []
        if not isinstance(plugins, list) or not all(isinstance(x, str) for x in plugins):
            raise RecordInvalid(f"{where}: field plugins must be a list of strings")
        try:
            rec = cls(key=EngineKey.from_dict(key), model_sha256=data["model_sha256"],
                      plan_sha256=data["plan_sha256"], plan_size=size, builder=data["builder"],
                      builder_version=data.get("builder_version", ""),
                      builder_log_sha256=data.get("builder_log_sha256", ""),
                      precision=data.get("precision", ""), plugins=list(plugins),
                      built_at=data.get("built_at", ""), built_on=data.get("built_on", ""))
        except (KeyError, TypeError, ValueError, OverflowError, ModelError) as exc:
            raise RecordInvalid(f"{where}: bad engine record ({exc})") from exc
        for name in ("model_sha256", "plan_sha256"):
            if not _SHA.fullmatch(getattr(rec, name)):
                raise RecordInvalid(f"{where}: field {name} is not a sha256")
        return rec

    @classmethod
    def read(cls, path: Path) -> EngineRecord:
        """The record in ``path``, read without following a symlink and at most :data:`MAX_RECORD_BYTES`.

        Raises:
            EngineError: no record there.
            RecordInvalid: a symlink, too large, not JSON, too deeply nested, or not a record.
        """
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise EngineError(f"{path}: no engine record") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise RecordInvalid(f"{path}: the engine record is a symlink; refused") from None
            raise RecordInvalid(f"{path}: unreadable engine record ({exc.strerror or exc})") from None
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read(MAX_RECORD_BYTES + 1)
        if len(raw) > MAX_RECORD_BYTES:
            raise RecordInvalid(f"{path}: the engine record is larger than {MAX_RECORD_BYTES} bytes; not a record")
        try:
            data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
        except RecursionError:
            raise RecordInvalid(f"{path}: the engine record nests too deeply; not a record") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise RecordInvalid(f"{path}: unreadable engine record ({exc})") from None
        return cls.from_dict(data, str(path))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


class EngineStore:
    """Engines by key and model under one root (see the module docstring for the layout).

    Args:
        root (Path): the ``engines`` directory.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def key_dir(self, key: EngineKey) -> Path:
        return self.root / key.slug

    def plan_path(self, key: EngineKey, model_sha256: str) -> Path:
        return self.key_dir(key) / f"{_check_sha(model_sha256)}.plan"

    def record_path(self, key: EngineKey, model_sha256: str) -> Path:
        return self.key_dir(key) / f"{_check_sha(model_sha256)}.json"

    def log_path(self, key: EngineKey, model_sha256: str) -> Path:
        return self.key_dir(key) / f"{_check_sha(model_sha256)}.log"

    def timing_cache_path(self, key: EngineKey) -> Path:
        return self.key_dir(key) / "timing.cache"

    def find(self, key: EngineKey, model_sha256: str) -> EngineRecord | None:
        """The record of the engine for this key and model, or None when there is none."""
        path = self.record_path(key, model_sha256)
        return EngineRecord.read(path) if path.is_file() or path.is_symlink() else None

    def verify(self, key: EngineKey, model_sha256: str) -> EngineRecord:
        """The record, once the stored engine is shown to be the one for this key and model.

        Raises:
            EngineError: no engine, a record for another key or model (a file copied or renamed
                into place), or plan bytes that do not hash to the record's sha256 (corrupt).
        """
        rec_path = self.record_path(key, model_sha256)
        self._owned(rec_path)
        rec = self.find(key, model_sha256)
        if rec is None:
            raise EngineError(f"no engine for key {key.slug} and model sha256 {model_sha256[:12]}... under {self.root}")
        if rec.key != key:
            raise EngineError(f"{rec_path}: the engine was built for key {rec.key.slug}, not this device's "
                              f"{key.slug}; refused")
        if rec.model_sha256 != model_sha256:
            raise EngineError(f"{rec_path}: the engine was built from model sha256 {rec.model_sha256[:12]}..., "
                              f"but the bundle's model is {model_sha256[:12]}...; refused (rebuild it: "
                              "cuvil-edge engine build --on DEVICE BUNDLE)")
        plan = self.plan_path(key, model_sha256)
        self._owned(plan)
        if not plan.is_file():
            raise EngineError(f"{plan}: the record names a plan that is not there; refused")
        size = plan.stat().st_size
        digest = sha256_file(plan)
        if size != rec.plan_size or digest != rec.plan_sha256:
            raise EngineError(f"{plan}: plan sha256 {digest[:12]}... ({size} bytes) is not the recorded "
                              f"{rec.plan_sha256[:12]}... ({rec.plan_size} bytes): corrupt engine refused")
        return rec

    def _owned(self, path: Path) -> None:
        """Refuse a path whose file or key directory is a symlink, or that resolves outside the root.

        Raises:
            EngineError: reached through a symlink, or outside ``root``.
        """
        for p in (path, path.parent):
            if p.is_symlink():
                raise EngineError(f"{p}: a symlink in the engine store; refused (engines are files of the store)")
        root = os.path.realpath(self.root)
        if os.path.commonpath([root, os.path.realpath(path)]) != root:
            raise EngineError(f"{path}: resolves outside the engine store {self.root}; refused")

    def quarantine(self, path: Path) -> Path | None:
        """Move a bad record aside (``<name>.bad``) so it is reported once, not at every load.

        Returns the new path, or None when it could not be moved (read-only store): the caller
        still serves without it.
        """
        target = path.with_name(path.name + ".bad")
        try:
            os.replace(path, target)
        except OSError:
            return None
        return target

    def put(self, record: EngineRecord, plan: bytes, log: bytes = b"", timing_cache: bytes | None = None) -> Path:
        """Store an engine: plan, log and timing cache first, the record last (the commit).

        Raises:
            EngineError: the plan bytes do not match the record (never stored).
        """
        if not plan or sha256_bytes(plan) != record.plan_sha256 or len(plan) != record.plan_size:
            raise EngineError(f"engine for {record.key.slug}: plan bytes do not match the record's sha256; "
                              "not stored")
        if log and record.builder_log_sha256 and sha256_bytes(log) != record.builder_log_sha256:
            raise EngineError(f"engine for {record.key.slug}: builder log does not match its digest; not stored")
        path = self.plan_path(record.key, record.model_sha256)
        rec_path = self.record_path(record.key, record.model_sha256)
        rec_path.unlink(missing_ok=True)  # a reader never pairs the old record with the new plan
        atomic_write_bytes(path, plan)
        atomic_write_bytes(self.log_path(record.key, record.model_sha256), log)
        if timing_cache:
            atomic_write_bytes(self.timing_cache_path(record.key), timing_cache)
        atomic_write_text(rec_path, json.dumps(record.to_dict(), indent=2, sort_keys=True) + "\n")
        return path

    def records(self) -> list[EngineRecord]:
        """Every readable record under the root (status reports)."""
        out: list[EngineRecord] = []
        if not self.root.is_dir():
            return out
        for key_dir in sorted(p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            for rec in sorted(key_dir.glob("*.json")):
                try:
                    out.append(EngineRecord.read(rec))
                except EngineError:
                    continue
        return out


def _check_sha(value: str) -> str:
    if not _SHA.fullmatch(str(value)):
        raise EngineError(f"model sha256 {value!r} is not a lowercase hex sha256")
    return str(value)


def host_engine_cache() -> EngineStore:
    """The host's engine cache: ``$CUVIL_EDGE_ENGINE_CACHE``, else ``<cuvil-edge cache>/engines``."""
    env = os.environ.get("CUVIL_EDGE_ENGINE_CACHE")
    if env:
        return EngineStore(Path(env).expanduser())
    return EngineStore(cache_dir() / "engines")
