"""Datatype names of the serving modules (their public names are pinned in tests/core/test_exported_members.py)."""

from __future__ import annotations

import pytest


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
