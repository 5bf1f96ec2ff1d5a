"""Stand-in for ``cuvil-edged`` until the daemon lands: the KServe v2 endpoints the health gate uses.

Serves ``current`` of each model from ``--store`` with ONNX Runtime: ``/v2/health/ready``,
``/v2/models/{m}[/versions/{v}]/ready``, JSON ``.../infer`` and the repository ``load`` /
``unload`` calls. Run: ``python standin_daemon.py --store DIR --port N``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import onnxruntime as ort

_NP = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32, "UINT8": np.uint8}
models: dict[str, tuple[str, ort.InferenceSession]] = {}
lock = threading.Lock()


def load(store: str, name: str) -> None:
    base = os.path.join(store, "bundles", name)
    version = os.path.basename(os.readlink(os.path.join(base, "current")))
    with open(os.path.join(base, version, "manifest.json")) as f:
        manifest = json.load(f)
    sess = ort.InferenceSession(os.path.join(base, version, manifest["model"]), providers=["CPUExecutionProvider"])
    with lock:
        models[name] = (version, sess)


class Handler(BaseHTTPRequestHandler):
    store = ""

    def log_message(self, *args: object) -> None:
        pass

    def reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/v2/health/ready":
            return self.reply(200, {})
        m = re.fullmatch(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/ready", self.path)
        if m:
            entry = models.get(m.group(1))
            if entry and (m.group(2) is None or m.group(2) == entry[0]):
                return self.reply(200, {})
            return self.reply(400, {"error": "not ready"})
        self.reply(404, {"error": "not found"})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        m = re.fullmatch(r"/v2/repository/models/([^/]+)/(load|unload)", self.path)
        if m:
            if m.group(2) == "unload":
                models.pop(m.group(1), None)
                return self.reply(200, {})
            try:
                load(self.store, m.group(1))
            except Exception as exc:  # noqa: BLE001
                return self.reply(400, {"error": f"load failed: {exc}"})
            return self.reply(200, {})
        m = re.fullmatch(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer", self.path)
        if m:
            entry = models.get(m.group(1))
            if not entry or (m.group(2) and m.group(2) != entry[0]):
                return self.reply(400, {"error": "Request for unknown model"})
            feeds = {i["name"]: np.asarray(i["data"], _NP[i["datatype"]]).reshape(i["shape"])
                     for i in body["inputs"]}
            names = [o.name for o in entry[1].get_outputs()]
            outs = entry[1].run(names, feeds)
            return self.reply(200, {"model_name": m.group(1), "model_version": entry[0], "outputs": [
                {"name": n, "datatype": "FP32", "shape": list(o.shape), "data": o.reshape(-1).tolist()}
                for n, o in zip(names, outs)]})
        self.reply(404, {"error": "not found"})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--store", required=True)
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args()
    Handler.store = args.store
    bundles = os.path.join(args.store, "bundles")
    for name in os.listdir(bundles) if os.path.isdir(bundles) else []:
        if os.path.islink(os.path.join(bundles, name, "current")):
            load(args.store, name)
    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
