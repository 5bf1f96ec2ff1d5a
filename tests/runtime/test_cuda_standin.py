"""The CUDA-init stand-in: opens the nodes CUDA opens on L4T 36, fails as CUDA would when one is refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cuvil_edge.runtime.cuda_standin import L4T36_CUDA_NODES, CudaInitError, cuda_init


def _nodes(root: Path, skip: str | None = None) -> None:
    for node in L4T36_CUDA_NODES:
        path = root / node.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        if node == skip:
            path.mkdir()  # a node that cannot be opened read-write (EISDIR)
        else:
            path.write_bytes(b"")


def test_opens_every_node_in_order(tmp_path):
    _nodes(tmp_path)
    assert cuda_init(str(tmp_path)) == list(L4T36_CUDA_NODES)


@pytest.mark.parametrize("refused", ["/dev/host1x-fence", "/dev/dri/renderD128"])
def test_a_refused_node_fails_like_cuda(tmp_path, refused):
    _nodes(tmp_path, skip=refused)
    with pytest.raises(CudaInitError, match=rf"cudaErrorNoDevice: .* could not open {refused} .*DeviceAllow={refused} rw"):
        cuda_init(str(tmp_path))


def test_a_missing_node_on_a_jetson_fails(tmp_path):
    _nodes(tmp_path)
    os.unlink(tmp_path / "dev/host1x-fence")
    with pytest.raises(CudaInitError, match="host1x-fence"):
        cuda_init(str(tmp_path))


def test_not_a_jetson_opens_nothing(tmp_path):
    assert cuda_init(str(tmp_path)) == []


def test_the_engine_standin_initialises_cuda_first(tmp_path):
    """The stand-in engine refuses to activate when CUDA's init would fail (before any ONNX load)."""
    from cuvil_edge.runtime.base import BackendOptions
    from cuvil_edge.runtime.trt_standin import TrtStandinBackend

    _nodes(tmp_path, skip="/dev/host1x-fence")
    backend = TrtStandinBackend(tmp_path / "missing.plan", BackendOptions(extra={"dev_root": str(tmp_path)}))
    with pytest.raises(CudaInitError, match="host1x-fence"):
        backend.activate()
