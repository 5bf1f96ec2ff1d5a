"""Which inference bodies are decoded off the event loop: compressed ones and large JSON only.

Binary tensors are views of the body, so decoding them takes microseconds at any size; sending
them to a thread only delays the request by two thread hand-offs, and a request that reaches the
batcher later misses the batch being formed. Every 602 KB EfficientNet-Lite0 request took that
detour once (its binary part was taken for JSON), and its batches at 8 clients on 16 cores held
3.1 images over HTTP against 3.7 over gRPC.
"""

from __future__ import annotations

import gzip
import json
import re
import urllib.request

import numpy as np
import tritonclient.http as httpclient

from cuvil_edge.daemon.kserve import App


def _offloaded(d) -> int:
    m = re.search(r"^cuvil_http_decoded_off_loop_total (\d+)", d.metrics(), re.M)
    assert m, "cuvil_http_decoded_off_loop_total is missing from /metrics"
    return int(m.group(1))


def test_the_rule_reads_the_json_part_only():
    big = App.OFFLOAD_BYTES + 1
    assert not App.offload_decode(602_312, b"212")  # binary tensors after a small JSON header
    assert App.offload_decode(big, None)  # all JSON
    assert App.offload_decode(big + 10, str(big).encode())  # a large JSON header, then binary
    assert not App.offload_decode(1000, None)
    assert App.offload_decode(big, b"not a number")  # read as all JSON, as decode_infer does


def test_binary_bodies_stay_on_the_loop_large_json_and_gzip_do_not(tmp_path, digits_model, digits_data,
                                                                   bundle_maker, installer, daemon_factory):
    root = tmp_path / "store"
    root.mkdir()
    installer(root, bundle_maker(tmp_path / "src" / "digits", digits_model, "digits", "1.0.0",
                                 sample=digits_data[:2], max_batch=4096))
    d = daemon_factory(root)
    x = np.ascontiguousarray(np.resize(digits_data, (2048, 1, 8, 8)), np.float32)  # 512 KiB binary
    http = d.client()
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    before = _offloaded(d)
    for _ in range(3):
        assert http.infer("digits", [inp]).as_numpy("logits").shape == (2048, 10)
    assert _offloaded(d) == before, "binary tensors were sent to a thread to be decoded"

    # The same tensor as JSON (about 1.2 MB of text): parsed on a worker thread.
    doc = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                       "data": x.ravel().tolist()}]}
    body = json.dumps(doc).encode()
    url = f"http://{d.url}/v2/models/digits/infer"
    with urllib.request.urlopen(urllib.request.Request(url, body, {"Content-Type": "application/json"})) as r:
        assert r.status == 200
    assert _offloaded(d) == before + 1
    # A compressed body, however small: decompressed on a worker thread.
    small = json.dumps({"inputs": [{"name": "input", "shape": [1, 1, 8, 8], "datatype": "FP32",
                                    "data": x[:1].ravel().tolist()}]}).encode()
    req = urllib.request.Request(url, gzip.compress(small), {"Content-Type": "application/json",
                                                              "Content-Encoding": "gzip"})
    with urllib.request.urlopen(req) as r:
        assert json.loads(r.read())["outputs"][0]["shape"] == [1, 10]
    assert _offloaded(d) == before + 2
