"""The bundle manifest: what a bundle holds and how to run it, signed as one JSON document."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cuvil_edge.bundle.names import check_component
from cuvil_edge.errors import BundleError

__all__ = ["DEFAULT_ATOL", "DEFAULT_RTOL", "FORMAT", "BundleTarget", "FileEntry", "Manifest", "TargetRelease"]

FORMAT = "cuvil-bundle/1"
DEFAULT_MODEL = "model.onnx"
DEFAULT_SAMPLES = {"sample_inputs": "sample/inputs.npz", "sample_expected": "sample/expected.npz"}
DEFAULT_RTOL = 1e-3
DEFAULT_ATOL = 1e-2
_PRECISIONS = {"fp32", "fp16", "int8", "mixed"}
_FORMAT_KINDS = {"tensorrt", "ort-cpu"}


@dataclass(frozen=True)
class TargetRelease:
    """One JetPack release the bundle's board profile lists: its L4T and TensorRT versions."""

    l4t: str
    tensorrt: str


@dataclass(frozen=True)
class BundleTarget:
    """The board a bundle was made for, as the manifest's ``target`` object states it.

    Deploy's compatibility check reads these (architecture, GPU SM, the JetPack releases the
    profile lists); the packager writes the whole profile (``Target.to_dict``), whose other
    fields stay in ``Manifest.target`` for tools that want them.
    """

    name: str = ""
    arch: str = ""
    gpu_sm: str = ""
    releases: tuple[TargetRelease, ...] = ()

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "manifest.json") -> BundleTarget:
        """Parse the ``target`` object; a field of the wrong type is an error naming it."""

        def text(key: str) -> str:
            value = data.get(key)
            if value is None:
                return ""
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise BundleError(f"{where}: field 'target.{key}' must be a string, got {type(value).__name__}")
            return str(value)

        raw = data.get("releases") or []
        if not isinstance(raw, list):
            raise BundleError(f"{where}: field 'target.releases' must be a list, got {type(raw).__name__}")
        releases = []
        for i, r in enumerate(raw):
            if not isinstance(r, dict) or not isinstance(r.get("l4t"), str) or not isinstance(r.get("tensorrt"), str):
                raise BundleError(f"{where}: field 'target.releases[{i}]' must be an object with string "
                                  "'l4t' and 'tensorrt'")
            releases.append(TargetRelease(r["l4t"], r["tensorrt"]))
        return cls(name=text("name"), arch=text("arch"), gpu_sm=text("gpu_sm"), releases=tuple(releases))


@dataclass(frozen=True)
class FileEntry:
    """One payload member: its path inside the bundle, sha256 and size."""

    path: str
    sha256: str
    size: int


@dataclass
class Manifest:
    """A parsed ``manifest.json``. ``raw`` keeps every field, also those this version ignores."""

    name: str
    version: str
    target: dict[str, Any]
    precision: str
    format_kind: str
    model: str
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    files: list[FileEntry]
    max_batch: int = 1
    preprocess: dict[str, Any] = field(default_factory=lambda: {"kind": "none"})
    postprocess: dict[str, Any] = field(default_factory=lambda: {"kind": "none"})
    validation: dict[str, Any] = field(default_factory=dict)
    latency_target_ms: dict[str, float] = field(default_factory=dict)
    engines: list[dict[str, Any]] = field(default_factory=list)
    build_plans: list[dict[str, Any]] = field(default_factory=list)
    plugins: dict[str, list[str]] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "manifest.json", *, complete: bool = True) -> Manifest:
        """Validate and parse; errors name the field.

        Args:
            data (dict): the parsed ``manifest.json``.
            where (str): what to name in errors. Defaults to "manifest.json".
            complete (bool): every required field of the format (a bundle being packed, signed,
                verified or deployed). False reads an extracted bundle the daemon serves: only
                ``name``, ``version``, ``inputs`` and ``outputs`` are required, ``model`` defaults
                to ``model.onnx`` and need not be listed in ``files`` (a directory installed
                unsigned by hand serves as it always did); a field that is present is still
                checked. Defaults to True.
        """
        if not isinstance(data, dict):
            raise BundleError(f"{where}: manifest must be a JSON object")
        if data.get("format") != FORMAT and (complete or "format" in data):
            raise BundleError(f"{where}: field 'format' must be '{FORMAT}', got {data.get('format')!r}")

        def need(key: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
            if key not in data:
                if not complete and default is not None:
                    return default
                raise BundleError(f"{where}: missing field '{key}'")
            if not isinstance(data[key], kind):
                raise BundleError(f"{where}: field '{key}' has the wrong type")
            return data[key]

        name = check_component("name", need("name", str))
        version = check_component("version", need("version", str))
        precision = need("precision", str, "")
        if precision not in _PRECISIONS and (complete or precision):
            raise BundleError(f"{where}: field 'precision' must be one of {sorted(_PRECISIONS)}")
        format_kind = need("format_kind", str, "")
        if format_kind not in _FORMAT_KINDS and (complete or format_kind):
            raise BundleError(f"{where}: field 'format_kind' must be one of {sorted(_FORMAT_KINDS)}")
        files = []
        for i, entry in enumerate(need("files", list, [])):
            try:
                path, digest, size = entry["path"], entry["sha256"], entry["size"]
                if not (isinstance(path, str) and isinstance(digest, str) and isinstance(size, int)
                        and not isinstance(size, bool) and size >= 0):
                    raise TypeError
                files.append(FileEntry(path, digest, size))
            except (KeyError, TypeError, ValueError):
                raise BundleError(f"{where}: files[{i}] needs path (string), sha256 (string) and size "
                                  "(integer >= 0)") from None
        paths = [f.path for f in files]
        if len(set(paths)) != len(paths):
            raise BundleError(f"{where}: field 'files' lists a path twice")
        model = need("model", str, DEFAULT_MODEL)
        if model not in paths and complete:
            raise BundleError(f"{where}: model '{model}' is not listed in 'files'")

        def optional(key: str, kind: type, default: Any) -> Any:
            value = data.get(key)
            if value is None or value == default:
                return default
            if not isinstance(value, kind) or isinstance(value, bool):
                raise BundleError(f"{where}: field '{key}' must be {'an object' if kind is dict else 'a ' + kind.__name__}"
                                  f", got {type(value).__name__}")
            return value

        max_batch = optional("max_batch", int, 1)
        if max_batch < 0:
            raise BundleError(f"{where}: field 'max_batch' must be >= 0, got {max_batch}")
        return cls(
            name=name,
            version=version,
            target=need("target", dict, {}),
            precision=precision,
            format_kind=format_kind,
            model=model,
            inputs=need("inputs", list),
            outputs=need("outputs", list),
            files=files,
            max_batch=max_batch,
            preprocess=dict(optional("preprocess", dict, {}) or {"kind": "none"}),
            postprocess=dict(optional("postprocess", dict, {}) or {"kind": "none"}),
            validation=dict(optional("validation", dict, {})),
            latency_target_ms=dict(optional("latency_target_ms", dict, {})),
            engines=list(optional("engines", list, [])),
            build_plans=list(optional("build_plans", list, [])),
            plugins=dict(optional("plugins", dict, {})),
            raw=data,
        )

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "manifest.json", *, complete: bool = True) -> Manifest:
        try:
            parsed = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BundleError(f"{where}: manifest is not valid JSON ({exc})") from None
        except RecursionError:
            raise BundleError(f"{where}: manifest nests too deeply to be a manifest") from None
        return cls.from_dict(parsed, where, complete=complete)

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, complete: bool = True) -> Manifest:
        """Load from an extracted bundle directory or a ``manifest.json`` path (no verification).

        ``complete=False`` reads a bundle the daemon serves (see :meth:`from_dict`).
        """
        path = Path(path)
        file = path / "manifest.json" if path.is_dir() else path
        try:
            data = file.read_bytes()
        except FileNotFoundError:
            raise BundleError(f"{file}: missing; a bundle directory holds manifest.json") from None
        except OSError as exc:
            raise BundleError(f"{file}: cannot read manifest ({exc.strerror})") from None
        return cls.from_bytes(data, str(file), complete=complete)

    # -- typed views of the optional sections --------------------------------------------------

    def declared(self, field_name: str) -> bool:
        """Whether the manifest itself sets ``field_name`` (False: the value is the format's default)."""
        return field_name in self.raw

    @property
    def key_id(self) -> str:
        """Id of the key that signed the bundle (16 hex digits, written by the tool), "" when unset."""
        return str(self.raw.get("key_id") or "")

    @property
    def target_name(self) -> str:
        """The id of the board profile the bundle was made for (``target.name``), "" when unset."""
        return str(self.target.get("name") or "")

    @property
    def board(self) -> BundleTarget:
        """The ``target`` object, typed (architecture, GPU SM, JetPack releases).

        Raises:
            BundleError: a field of ``target`` has the wrong type (the error names it).
        """
        return BundleTarget.from_dict(self.target)

    def sample_member(self, kind: str) -> str:
        """Path inside the bundle of the validation sample ``kind`` (``sample_inputs`` or
        ``sample_expected``), the format's default when the manifest names none."""
        return str(self.validation.get(kind) or DEFAULT_SAMPLES[kind])

    @property
    def tolerances(self) -> tuple[float, float]:
        """(rtol, atol) that the warm-up check and the deploy health gate apply to the sample."""
        return (float(self.validation.get("rtol", DEFAULT_RTOL)), float(self.validation.get("atol", DEFAULT_ATOL)))

    @property
    def batch_axes(self) -> dict[str, int | None]:
        """Each input's batch axis: the entry's ``batch_axis`` (an integer, or null for an input
        without one, as a scalar), 0 when the entry does not say (the packager omits the default)."""
        out: dict[str, int | None] = {}
        for entry in self.inputs:
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                continue
            axis = entry.get("batch_axis", 0)
            out[entry["name"]] = axis if axis is None or (isinstance(axis, int) and not isinstance(axis, bool)) else 0
        return out

    @property
    def state_inputs(self) -> dict[str, str]:
        """Inputs that carry a stream's state, each with the output that feeds it back: an input
        entry's ``state_output`` (the client sends the state it got last time; the daemon keeps
        none). Empty for a stateless model."""
        return {e["name"]: e["state_output"] for e in self.inputs
                if isinstance(e, dict) and isinstance(e.get("name"), str) and isinstance(e.get("state_output"), str)}

    @property
    def profile_shapes(self) -> dict[str, list[int]]:
        """Per dynamic input, the ``opt`` shape of the TensorRT optimization profile the manifest
        carries (``inputs[i].profile``), a size the recipe chose for it; empty when none."""
        out: dict[str, list[int]] = {}
        for entry in self.inputs:
            prof = entry.get("profile") if isinstance(entry, dict) else None
            opt = prof.get("opt") if isinstance(prof, dict) else None
            if isinstance(opt, list) and all(isinstance(d, int) and not isinstance(d, bool) for d in opt):
                out[str(entry["name"])] = list(opt)
        return out

    @property
    def latency_p95_ms(self) -> float | None:
        """The recipe's p95 latency goal in milliseconds, if it set one."""
        value = self.latency_target_ms.get("p95")
        return None if value is None else float(value)

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.raw)
        out.update(
            {
                "format": FORMAT,
                "name": self.name,
                "version": self.version,
                "target": self.target,
                "precision": self.precision,
                "format_kind": self.format_kind,
                "model": self.model,
                "inputs": self.inputs,
                "outputs": self.outputs,
                "max_batch": self.max_batch,
                "preprocess": self.preprocess,
                "postprocess": self.postprocess,
                "validation": self.validation,
                "latency_target_ms": self.latency_target_ms,
                "engines": self.engines,
                "build_plans": self.build_plans,
                "plugins": self.plugins,
                "files": [asdict(f) for f in self.files],
            }
        )
        return out

    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n").encode("utf-8")

    def file(self, path: str) -> FileEntry:
        for entry in self.files:
            if entry.path == path:
                return entry
        raise BundleError(f"bundle '{self.name}' has no member '{path}'")
