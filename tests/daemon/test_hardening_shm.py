"""Red-team round 3 (issue #26), shared memory: findings 1 and 6.

The client owns a system shared-memory object and may shrink it after registering it (finding 1:
the daemon used to die of SIGBUS, exit 135, reading or writing through its mapping), or register
a sparse region far larger than a body may be (finding 6: a 512 MiB image read with
``--max-body-mb 64``). Here the regions are real POSIX shm objects in ``/dev/shm``, scaled down.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

SHM = Path("/dev/shm")
pytestmark = pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm")


@pytest.fixture
def shm_key():
    keys: list[str] = []

    def make(size: int) -> str:
        key = f"cuvil-hard-{uuid.uuid4().hex[:10]}"
        with open(SHM / key, "wb") as f:
            f.truncate(size)
        keys.append(key)
        return key

    yield make
    for key in keys:
        (SHM / key).unlink(missing_ok=True)


def _serves(d, digits_data) -> None:
    client = d.client()
    x = digits_data[:1]
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    assert client.infer("digits", [inp]).as_numpy("logits").shape == (1, 10)
    assert d.proc.poll() is None


def test_finding1_truncated_shm_region_is_a_clean_error_not_sigbus(store, daemon_factory, digits_data, shm_key):
    d = daemon_factory(store)
    x = np.ascontiguousarray(digits_data[:2])
    in_key, out_key = shm_key(x.nbytes), shm_key(4096)
    (SHM / in_key).write_bytes(x.tobytes())
    http = d.client()
    http.register_system_shared_memory("in", f"/{in_key}", x.nbytes)
    http.register_system_shared_memory("out", f"/{out_key}", 4096)
    os.truncate(SHM / in_key, 0)  # the client shrinks both objects under the daemon
    os.truncate(SHM / out_key, 0)
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_shared_memory("in", x.nbytes)
    with pytest.raises(InferenceServerException, match="shorter than when it was registered"):
        http.infer("digits", [inp])
    g = d.grpc_client()
    ginp = grpcclient.InferInput("input", list(x.shape), "FP32")
    ginp.set_shared_memory("in", x.nbytes)
    with pytest.raises(InferenceServerException, match="shorter than when it was registered"):
        g.infer("digits", [ginp])
    # An output into a shrunk object: written (the object grows back), never a fault.
    ok = httpclient.InferInput("input", list(x.shape), "FP32")
    ok.set_data_from_numpy(x)
    out = httpclient.InferRequestedOutput("logits", binary_data=True)
    out.set_shared_memory("out", 2 * 10 * 4)
    http.infer("digits", [ok], outputs=[out])
    got = np.frombuffer((SHM / out_key).read_bytes()[:80], np.float32).reshape(2, 10)
    assert np.isfinite(got).all() and got.any()
    _serves(d, digits_data)
    assert "Traceback" not in d.log


def test_finding6_shm_input_counts_against_max_body(store, daemon_factory, digits_data, shm_key):
    d = daemon_factory(store, "--max-body-mb", "1")
    per_item = 1 * 8 * 8 * 4
    n = (8 << 20) // per_item  # 8 MiB of a sparse region, eight times the body limit
    key = shm_key(n * per_item)
    http = d.client()
    http.register_system_shared_memory("big", f"/{key}", n * per_item)
    rss = d.rss_kb()
    for client, mod in ((http, httpclient), (d.grpc_client(), grpcclient)):
        inp = mod.InferInput("input", [n, 1, 8, 8], "FP32")
        inp.set_shared_memory("big", n * per_item)
        with pytest.raises(InferenceServerException, match=r"exceeds the limit of 1048576 bytes.*--max-body-mb"):
            client.infer("digits", [inp])
    assert d.rss_kb() - rss < 4 << 10  # nothing of the 8 MiB was read
    _serves(d, digits_data)
