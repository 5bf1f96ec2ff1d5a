"""Public names of the serving modules, pinned; every module imports without optional extras."""

from __future__ import annotations

import importlib

import pytest

MODULES = {
    "cuvil_edge.runtime": ["BACKENDS", "Backend", "BackendOptions", "Footprint", "TensorSpec", "backend_class",
                           "datatype_of", "dtype_of", "load_backend"],
    "cuvil_edge.runtime.base": ["Backend", "BackendOptions", "Footprint", "TensorSpec", "datatype_of", "dtype_of"],
    "cuvil_edge.runtime.ort": ["OrtBackend", "rss_bytes"],
    "cuvil_edge.runtime.buffers": ["BufferPool", "PageLockedAllocator", "Placement", "host_allocator"],
    "cuvil_edge.daemon.accept": ["Acceptor", "BUSY_ANSWER", "FULL_ANSWER", "connection_cap", "listen_tcp",
                                 "listen_unix"],
    "cuvil_edge.daemon.batcher": ["Batcher", "Pending"],
    "cuvil_edge.daemon.limits": ["JsonRefused", "Limits", "bearer_ok", "finite_json_list", "json_depth",
                                 "loads_limited"],
    "cuvil_edge.daemon.config": ["ENV_PREFIX", "OPTIONS", "Config", "build_parser", "load"],
    "cuvil_edge.daemon.http": ["HttpProtocol", "Request", "STATUS_LINES", "json_error"],
    "cuvil_edge.daemon.gpu_metrics": ["RAIL_PREFERENCE", "GpuMetrics", "gpu_rail", "gpu_uuid", "power_limit_w"],
    "cuvil_edge.daemon.grpc_server": ["DEFAULT_GRPC_PORT", "GrpcFrontend", "RpcFailure", "decode_grpc_infer",
                                      "grpc_address"],
    "cuvil_edge.daemon.kserve": ["EXTENSIONS", "App", "BadRequest", "MemoryRefused", "decode_infer",
                                 "model_config_doc", "model_metadata_doc"],
    "cuvil_edge.daemon.main": ["main"],
    "cuvil_edge.daemon.metrics": ["ModelStats", "render_prometheus"],
    "cuvil_edge.daemon.models": ["ModelEntry", "ModelInstance", "ModelRegistry", "UnknownModel"],
    "cuvil_edge.daemon.pipeline": ["DETECTIONS", "IMAGE_INPUT", "NUM_DETECTIONS", "TOPK_CLASSES", "TOPK_SCORES",
                                   "Pipeline", "kernels"],
    "cuvil_edge.daemon.resources": ["Resources"],
    "cuvil_edge.daemon.server": ["STARTUP_FAILURE", "Server", "ServerState"],
    "cuvil_edge.daemon.shm": ["CUDA_SHM_UNSUPPORTED", "OutputTarget", "SharedMemoryError", "SharedMemoryRegistry",
                              "ShmRegion", "shm_params", "shm_route"],
    "cuvil_edge.daemon.store": ["BundleStore", "read_manifest"],
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_exported_members(name):
    module = importlib.import_module(name)
    assert sorted(module.__all__) == sorted(MODULES[name])
    for member in module.__all__:
        assert hasattr(module, member), f"{name}.{member}"


def test_datatype_names_round_trip():
    import numpy as np

    from cuvil_edge.errors import ModelError
    from cuvil_edge.runtime import datatype_of, dtype_of

    for kserve, np_name in (("FP32", "float32"), ("FP16", "float16"), ("UINT8", "uint8"), ("INT64", "int64"),
                            ("BOOL", "bool")):
        assert dtype_of(kserve) == np.dtype(np_name) == dtype_of(np_name)
        assert datatype_of(np.dtype(np_name)) == kserve
    assert dtype_of("float") == np.dtype(np.float32)
    with pytest.raises(ModelError, match="unknown tensor datatype"):
        dtype_of("BYTES")


def test_load_backend_picks_ort_without_tensorrt(tmp_path, digits_model):
    import shutil

    from cuvil_edge.errors import DaemonError
    from cuvil_edge.runtime import load_backend

    shutil.copy(digits_model, tmp_path / "model.onnx")
    (tmp_path / "engines").mkdir()
    (tmp_path / "engines" / "x.engine").write_bytes(b"not an engine")
    manifest = {"name": "d", "version": "1", "model": "model.onnx", "format_kind": "tensorrt",
                "engines": [{"key": {}, "path": "engines/x.engine"}]}
    backend = load_backend(tmp_path, manifest)
    assert backend.kind == "ort"  # no TensorRT here: the ONNX model still serves
    with backend:
        import numpy as np

        out = backend.infer({"input": np.zeros((2, 1, 8, 8), np.float32)})
        assert out["logits"].shape == (2, 10)
        assert backend.footprint().measured
    assert not backend.is_active
    with pytest.raises(DaemonError, match="tensorrt"):
        load_backend(tmp_path, manifest, kind="tensorrt")


@pytest.mark.parametrize("spin, expected", [(None, "1"), (True, "1"), (False, "0")])
def test_ort_spinning_follows_the_option(digits_model, spin, expected):
    """Spinning is ONNX Runtime's default and the daemon's; ``--spin 0`` turns it off."""
    from cuvil_edge.runtime.base import BackendOptions
    from cuvil_edge.runtime.ort import OrtBackend

    extra = {} if spin is None else {"spin": spin}
    with OrtBackend(digits_model, BackendOptions(extra=extra)) as backend:
        so = backend._session.get_session_options()
        try:
            value = so.get_session_config_entry("session.intra_op.allow_spinning")
        except RuntimeError:  # not set: ONNX Runtime's default, which spins
            value = "1"
        assert value == expected


def test_daemon_spin_option_reaches_the_backend():
    from cuvil_edge.daemon.config import load

    assert load(["--spin", "0"]).spin is False
    assert load([]).spin is True
