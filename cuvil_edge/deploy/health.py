"""Health gate: the daemon serves the new version and the bundle's validation sample checks out.

The gate passes when, within a timeout, ``/v2/models/{m}/versions/{v}/ready`` answers 200 and an
inference on ``sample/inputs.npz`` returns outputs within the manifest's ``validation.rtol`` /
``validation.atol`` of ``sample/expected.npz``. It speaks KServe v2 JSON over plain HTTP to a
base URL: from the host that is an SSH port forward to the daemon's loopback port; on the device
(the Ansible role, through ``python -m cuvil_edge.deploy.ondevice health``) it is
``http://127.0.0.1:8000`` directly.
"""

from __future__ import annotations

import io
import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from cuvil_edge.errors import DeployError

if TYPE_CHECKING:
    from cuvil_edge.bundle.manifest import Manifest

__all__ = ["DaemonHTTPFailure", "HealthResult", "check_health", "daemon_load", "daemon_request", "daemon_unload",
           "sample_member"]

_DTYPES = {
    "float32": "FP32", "float16": "FP16", "float64": "FP64", "int64": "INT64", "int32": "INT32",
    "int16": "INT16", "int8": "INT8", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32",
    "uint64": "UINT64", "bool": "BOOL",
}
_NUMPY = {v: k for k, v in _DTYPES.items()}


@dataclass
class HealthResult:
    """Outcome of a health gate: ``ok`` and, when not, ``reason``."""

    ok: bool
    reason: str = ""
    seconds: float = 0.0
    max_abs_err: float | None = None
    outputs_checked: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class DaemonHTTPFailure(DeployError):
    """The daemon did not answer; callers turn it into a health result or a DeployError message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def daemon_request(base_url: str, method: str, path: str, body: Any = None, timeout: float = 10.0,
                   token: str | None = None) -> tuple[int, Any]:
    """One JSON request; returns (status, decoded body). Raises DaemonHTTPFailure(0, ...) when unreachable."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base_url.rstrip("/") + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        status = exc.code
        exc.close()
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DaemonHTTPFailure(0, f"daemon not reachable at {base_url}: {reason}") from None
    try:
        decoded = json.loads(raw) if raw else {}
    except ValueError:
        decoded = {"raw": raw[:200].decode(errors="replace")}
    return status, decoded


def _error_text(body: Any) -> str:
    if isinstance(body, dict) and "error" in body:
        return str(body["error"])
    return json.dumps(body)[:200]


def _repository(base_url: str, model: str, action: str, timeout: float, token: str | None) -> str | None:
    path = f"/v2/repository/models/{model}/{action}"
    try:
        status, body = daemon_request(base_url, "POST", path, {}, timeout=timeout, token=token)
    except DaemonHTTPFailure as exc:
        return exc.message
    if status != 200:
        return f"{action} of {model} failed: HTTP {status}: {_error_text(body)}"
    return None


def daemon_load(base_url: str, model: str, timeout: float = 60.0, token: str | None = None) -> str | None:
    """Ask the daemon to (re)load ``model`` from the store; None on success, else the reason."""
    return _repository(base_url, model, "load", timeout, token)


def daemon_unload(base_url: str, model: str, timeout: float = 30.0, token: str | None = None) -> str | None:
    """Ask the daemon to unload ``model``; None on success, else the reason."""
    return _repository(base_url, model, "unload", timeout, token)


def _load_npz(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def sample_member(version_dir: str | os.PathLike[str], manifest: Manifest, kind: str) -> bytes | None:
    """The bytes of the bundle's validation sample ``kind`` (``sample_inputs`` or ``sample_expected``)
    in an extracted version directory; None when the bundle has none (the gate then checks readiness only)."""
    path = os.path.join(os.fspath(version_dir), manifest.sample_member(kind))
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return f.read()


def check_health(
    base_url: str,
    manifest: Manifest,
    inputs_npz: bytes | None,
    expected_npz: bytes | None,
    timeout: float = 60.0,
    token: str | None = None,
    poll: float = 0.2,
) -> HealthResult:
    """Run the health gate against a daemon.

    Args:
        base_url (str): the daemon, e.g. ``http://127.0.0.1:8000``.
        manifest (Manifest): the bundle's typed manifest (name, version, validation tolerances).
        inputs_npz (bytes): ``sample/inputs.npz``; None skips the sample check (ready only).
        expected_npz (bytes): ``sample/expected.npz``.
        timeout (float): seconds for the whole gate. Defaults to 60.
        token (str): bearer token of the daemon. Defaults to None.
        poll (float): seconds between readiness polls. Defaults to 0.2.
    """
    start = time.monotonic()
    deadline = start + timeout
    name, version = manifest.name, manifest.version
    ready_path = f"/v2/models/{name}/versions/{version}/ready"
    last = "no answer yet"
    while True:
        try:
            status, body = daemon_request(base_url, "GET", ready_path, timeout=max(1.0, deadline - time.monotonic()),
                                          token=token)
            if status == 200:
                break
            last = f"model {name} version {version} not ready (HTTP {status}: {_error_text(body)})"
        except DaemonHTTPFailure as exc:
            last = exc.message
        if time.monotonic() >= deadline:
            return HealthResult(False, f"timeout after {timeout:g} s: {last}", time.monotonic() - start)
        time.sleep(poll)
    if inputs_npz is None or expected_npz is None:
        return HealthResult(True, "ready (bundle has no validation sample)", time.monotonic() - start)
    rtol, atol = manifest.tolerances
    inputs = _load_npz(inputs_npz)
    expected = _load_npz(expected_npz)
    request = {
        "inputs": [
            {"name": k, "shape": list(v.shape), "datatype": _DTYPES.get(str(v.dtype), "FP32"),
             "data": v.reshape(-1).tolist()}
            for k, v in inputs.items()
        ],
        "outputs": [{"name": k, "parameters": {"binary_data": False}} for k in expected],
    }
    infer_path = f"/v2/models/{name}/versions/{version}/infer"
    while True:
        try:
            status, body = daemon_request(base_url, "POST", infer_path, request,
                                          timeout=max(1.0, deadline - time.monotonic()), token=token)
            if status == 200:
                break
            last = f"inference on the validation sample failed: HTTP {status}: {_error_text(body)}"
            if 400 <= status < 500 and status not in (404, 409, 429):
                return HealthResult(False, last, time.monotonic() - start)
        except DaemonHTTPFailure as exc:
            last = exc.message
        if time.monotonic() >= deadline:
            return HealthResult(False, f"timeout after {timeout:g} s: {last}", time.monotonic() - start)
        time.sleep(poll)
    if not isinstance(body, dict) or not isinstance(body.get("outputs"), list):
        return HealthResult(False, f"the daemon's inference answer has no 'outputs' list: {str(body)[:200]}",
                            time.monotonic() - start)
    got = {o.get("name"): o for o in body["outputs"] if isinstance(o, dict)}
    worst = 0.0
    for key, want in expected.items():
        out = got.get(key)
        if out is None:
            return HealthResult(False, f"the daemon's answer lacks output '{key}'", time.monotonic() - start)
        dtype = _NUMPY.get(str(out.get("datatype")), "float32")
        try:
            arr = np.asarray(out.get("data", []), dtype=dtype)
        except (TypeError, ValueError) as exc:
            return HealthResult(False, f"output '{key}' data unreadable: {exc}", time.monotonic() - start)
        if arr.size != want.size:
            return HealthResult(False, f"output '{key}' has {arr.size} values, expected {want.size}",
                                time.monotonic() - start)
        arr = arr.reshape(want.shape)
        err = float(np.max(np.abs(arr.astype(np.float64) - want.astype(np.float64)))) if want.size else 0.0
        worst = max(worst, err)
        if not np.allclose(arr, want, rtol=rtol, atol=atol):
            return HealthResult(
                False,
                f"validation sample mismatch on output '{key}': max |error| {err:.4g} exceeds "
                f"rtol={rtol:g}/atol={atol:g}",
                time.monotonic() - start, err, sorted(expected),
            )
    return HealthResult(True, "", time.monotonic() - start, worst, sorted(expected))

