"""STAND-IN TensorRT runtime for tests without TensorRT. NOT TensorRT; it never claims to be.

It loads the engine files the stand-in builder writes (:mod:`cuvil_edge.packager.engine_standin`, format in :mod:`cuvil_edge.runtime.standin_plan`:
a header and the ONNX model) and runs that ONNX model with ONNX Runtime. It exists so the engine
path around the runtime (engine selection by key, record and sha256 checks, the daemon's choice
and fallback, ``/config`` and ``cuvil-edge status`` reports, swaps and rollbacks) runs end to end
on machines where TensorRT cannot be installed. Its ``kind`` is ``tensorrt-standin`` and the
daemon reports exactly that; it serves only when the daemon is started with ``--engine-standin``.
A real TensorRT plan is refused here (it needs :class:`~cuvil_edge.runtime.trt.TrtBackend`).
"""

from __future__ import annotations

from pathlib import Path

from cuvil_edge.errors import DaemonError
from cuvil_edge.runtime._manifest import ManifestLike
from cuvil_edge.runtime.base import BackendOptions
from cuvil_edge.runtime.ort import OrtBackend

__all__ = ["TrtStandinBackend"]


class TrtStandinBackend(OrtBackend):
    """Runs a stand-in engine's embedded ONNX model with ONNX Runtime (CPU).

    Args:
        engine_path (Path): the stand-in ``.plan`` file.
        options (BackendOptions | None): runtime options. Defaults to ``BackendOptions()``.
        name (str | None): label for logs. Defaults to the file name.
        expect_model_sha256 (str | None): refuse the engine unless its embedded model has this
            sha256 (the bundle's model). Defaults to no check.
    """

    kind = "tensorrt-standin"

    def __init__(self, engine_path: Path, options: BackendOptions | None = None, name: str | None = None,
                 expect_model_sha256: str | None = None) -> None:
        super().__init__(Path(engine_path), options, name or Path(engine_path).name,
                         providers=["CPUExecutionProvider"])
        self.engine_path = Path(engine_path)
        self._expect = expect_model_sha256
        self._onnx: bytes | None = None
        self.cuda_nodes: list[str] = []

    @classmethod
    def from_bundle(cls, bundle_dir: Path, manifest: ManifestLike,
                    options: BackendOptions | None = None) -> TrtStandinBackend:
        raise DaemonError("the stand-in TensorRT runtime loads engines from the engine store, not from bundles")

    def activate_impl(self) -> None:
        # CUDA initialises before TensorRT deserializes anything: on an L4T board the stand-in opens
        # the GPU nodes CUDA opens, so the daemon's device cgroup is exercised (cuda_standin.py).
        from cuvil_edge.runtime.cuda_standin import cuda_init

        self.cuda_nodes = cuda_init(str(self.options.extra.get("dev_root", "/")))
        super().activate_impl()

    def model_source(self) -> bytes:
        if self._onnx is None:
            from cuvil_edge.runtime.standin_plan import read_standin_plan

            try:
                header, onnx = read_standin_plan(self.engine_path.read_bytes(), str(self.engine_path))
            except (OSError, ValueError) as exc:
                raise DaemonError(f"{self.engine_path}: {exc}") from exc
            if self._expect and header.get("model_sha256") != self._expect:
                raise DaemonError(f"{self.engine_path}: stand-in engine holds model sha256 "
                                  f"{str(header.get('model_sha256'))[:12]}..., not the bundle's {self._expect[:12]}...")
            self._onnx = onnx
        return self._onnx
