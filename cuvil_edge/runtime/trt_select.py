"""Which runtime serves a bundle on this device: its TensorRT engine, or ONNX Runtime and why.

The daemon calls :func:`choose_engine` for every load (start, SIGHUP swap, repository load,
rollback). It looks in ``<store>/engines/<this device's key>/<bundle model sha256>.plan`` and
serves that engine only when its record (:mod:`cuvil_edge.bundle.engine_store`) names this
device's key and this bundle's model and the plan hashes to the recorded sha256. Anything else
- no key (no TensorRT on the board), no engine yet, a record for another model, a corrupt plan,
TensorRT not importable, a stand-in engine without ``--engine-standin`` - gives ONNX Runtime with
the reason, which ``/v2/models/{m}/config`` and ``cuvil-edge status`` show. Refusals are logged
as warnings: a bad engine never stops a bundle from serving.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cuvil_edge.runtime._manifest import ManifestLike, as_manifest
from cuvil_edge.runtime.base import Backend, BackendOptions

__all__ = ["EngineChoice", "backend_for_choice", "bundle_model_sha256", "choose_engine", "device_engine_key"]

log = logging.getLogger("cuvil_edge.runtime.trt_select")

ORT = "onnxruntime"
TRT = "tensorrt"
STANDIN = "tensorrt-standin"


@dataclass
class EngineChoice:
    """The runtime chosen for one bundle load, and why. ``backend`` is what /config reports."""

    backend: str = ORT
    precision: str = ""
    engine_key: str | None = None
    engine_path: str | None = None
    plan_sha256: str | None = None
    model_sha256: str | None = None
    builder: str | None = None
    plugins: list[str] | None = None
    reason: str = ""
    refused: bool = False

    def fall_back(self, reason: str, refused: bool = False) -> EngineChoice:
        """The same load served by ONNX Runtime, saying why."""
        return EngineChoice(ORT, self.precision, self.engine_key, self.engine_path, self.plan_sha256,
                            self.model_sha256, self.builder, self.plugins, reason, refused or self.refused)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def device_engine_key(root: str, bundle_dir: Path, manifest: ManifestLike,
                      dla_core: int | None = None) -> tuple[Any, str]:
    """This device's engine key for the bundle, from the facts below ``root`` and the bundle's
    build plan for this device, or ``(None, reason)``.

    When TensorRT imports here, its own version counts (it may differ from the dpkg package).
    """
    import json

    from cuvil_edge.bundle.device_facts import probe_local
    from cuvil_edge.bundle.engine_plan import validate_plan
    from cuvil_edge.bundle.engine_store import (
        EngineError,
        device_identity,
        key_for_facts,
        plan_matches_device,
    )
    from cuvil_edge.errors import ModelError

    facts = probe_local(root)
    trt = None
    try:
        from cuvil_edge.runtime.trt import TensorRTMissing, installed_tensorrt_version

        trt = installed_tensorrt_version()
    except TensorRTMissing:
        trt = None
    try:
        device = device_identity(facts, trt)
    except EngineError as exc:
        return None, str(exc)
    manifest = as_manifest(manifest)
    for entry in manifest.build_plans:
        path = Path(bundle_dir) / str(entry.get("path"))
        try:
            plan = validate_plan(json.loads(path.read_text("utf-8")), str(path))
        except (OSError, ValueError, ModelError) as exc:
            return None, f"build plan {entry.get('path')}: {exc}"
        if plan_matches_device(plan, device, dla_core):
            return key_for_facts(facts, plan, trt), ""
    return None, (f"the bundle has no build plan for this device ({device.module}, TensorRT {device.tensorrt}, "
                  f"SM {device.sm}, DLA {dla_core})")


def bundle_model_sha256(bundle_dir: Path, manifest: ManifestLike) -> str:
    """The sha256 of the bundle's model: the manifest's file entry (checked at install), else hashed."""
    from cuvil_edge.bundle.engine_store import sha256_file

    manifest = as_manifest(manifest)
    for entry in manifest.files:
        if entry.path == manifest.model and entry.sha256:
            return entry.sha256
    return sha256_file(Path(bundle_dir) / manifest.model)


def choose_engine(
    engines_root: Path,
    bundle_dir: Path,
    manifest: ManifestLike,
    root: str = "/",
    dla_core: int | None = None,
    allow_standin: bool = False,
    device: str = "auto",
) -> EngineChoice:
    """The runtime for this bundle on this device (see the module docstring).

    Args:
        engines_root (Path): ``<store>/engines``.
        bundle_dir (Path): the extracted bundle.
        manifest (Manifest | Mapping[str, Any]): its manifest (the dict form is read as a ``Manifest``).
        root (str): system root for the device's facts. Defaults to ``/``.
        dla_core (int | None): the DLA core engines should run on. Defaults to the GPU.
        allow_standin (bool): serve stand-in engines (tests without TensorRT). Defaults to False.
        device (str): the daemon's ``--device``; ``cpu`` never picks an engine. Defaults to auto.
    """
    from cuvil_edge.bundle.engine_store import EngineError, EngineStore, RecordInvalid

    manifest = as_manifest(manifest)
    name = f"{manifest.name} {manifest.version}"
    choice = EngineChoice(precision=manifest.precision)
    if manifest.format_kind != "tensorrt":
        return choice.fall_back(f"bundle format {manifest.format_kind!r} is not for TensorRT")
    if device == "cpu":
        return choice.fall_back("daemon runs with --device cpu")
    key, why = device_engine_key(root, bundle_dir, manifest, dla_core)
    if key is None:
        return choice.fall_back(why)
    choice.engine_key = key.slug
    sha = choice.model_sha256 = bundle_model_sha256(bundle_dir, manifest)
    store = EngineStore(engines_root)
    choice.engine_path = str(store.plan_path(key, sha))
    record = store.record_path(key, sha)
    if not (record.is_file() or record.is_symlink()):
        return choice.fall_back(f"no engine for key {key.slug} and model sha256 {sha[:12]}... yet; build it: "
                                "cuvil-edge engine build --on DEVICE BUNDLE")
    try:
        rec = store.verify(key, sha)
    except RecordInvalid as exc:
        # Not a record: moved aside so this is said once, not at every load; the bundle serves.
        moved = store.quarantine(record) if not record.is_symlink() else None
        log.warning("%s: engine record refused, serving with ONNX Runtime: %s%s", name, exc,
                    f" (moved to {moved.name})" if moved is not None else "")
        return choice.fall_back(f"engine refused: {exc}", refused=True)
    except EngineError as exc:
        log.warning("%s: engine refused, serving with ONNX Runtime: %s", name, exc)
        return choice.fall_back(f"engine refused: {exc}", refused=True)
    except Exception as exc:  # noqa: BLE001 - whatever is on disk, a bad engine never stops a bundle
        log.warning("%s: engine refused (%s: %s), serving with ONNX Runtime", name, type(exc).__name__, exc)
        return choice.fall_back(f"engine refused: {type(exc).__name__}: {exc}", refused=True)
    choice.plan_sha256, choice.builder, choice.plugins = rec.plan_sha256, rec.builder, list(rec.plugins)
    if rec.is_standin:
        if not allow_standin:
            return choice.fall_back("the engine was made by the STAND-IN builder (tests without TensorRT), not "
                                    "TensorRT; start cuvil-edged with --engine-standin to serve it")
        choice.backend = STANDIN
        return choice
    from cuvil_edge.runtime.trt import TrtBackend

    ok, why = TrtBackend.available()
    if not ok:
        return choice.fall_back(f"engine {key.slug} is there but {why}")
    choice.backend = TRT
    return choice


def backend_for_choice(choice: EngineChoice, manifest: ManifestLike, options: BackendOptions) -> Backend:
    """Construct (not activate) the backend of an engine choice other than ONNX Runtime."""
    manifest = as_manifest(manifest)
    name = f"{manifest.name or 'model'}:{manifest.version or '?'}"
    assert choice.engine_path is not None
    if choice.backend == STANDIN:
        from cuvil_edge.runtime.trt_standin import TrtStandinBackend

        return TrtStandinBackend(Path(choice.engine_path), options, name, expect_model_sha256=choice.model_sha256)
    from cuvil_edge.runtime.trt import TrtBackend
    from cuvil_edge.runtime.trt.backend import declared_specs

    if choice.plugins:
        # The model's plugins were registered for the build; they must be before deserializing.
        import dataclasses

        options = dataclasses.replace(options, extra={**options.extra, "python_plugins": True})
    return TrtBackend(Path(choice.engine_path), options, name=name, specs=declared_specs(manifest))
