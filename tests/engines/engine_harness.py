"""Helpers for the engine tests and benchmark: Jetson-looking loopback devices (real sshd + real daemon),
bundles with build plans. Named uniquely (not ``conftest``) so test modules and ``bench/`` import it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "deploy"))

from deploy_harness import (  # noqa: E402
    Daemon,
    SshDevice,
    fake_board,
    make_key,
    start_sshd,
    write_known_hosts,
)

__all__ = ["DEVICE_CLI", "KEY_SLUG", "PLAN_FIELDS", "bundle_key_slug", "REPO", "Board", "fake_board", "make_engine_bundle", "make_key", "second_model"]

# How the device runs cuvil-edge: this checkout's code with the test interpreter (the venv's own
# editable install points at another checkout, and sshd passes no environment).
DEVICE_CLI = ["env", f"PYTHONPATH={REPO}", sys.executable, "-m", "cuvil_edge.cli"]
# What make_engine_bundle plans for (the digits CNN's [N, 1, 8, 8] input): its plan digest is in the key.
PLAN_FIELDS = {"precision": "fp32", "max_batch": 8, "model": "model.onnx",
               "inputs": [{"name": "input", "dtype": "float32", "shape": [-1, 1, 8, 8]}]}


def bundle_key_slug(module: str = "orin-nano-8sm-8gb") -> str:
    """The engine key of make_engine_bundle's JetPack 6.2 plan on a board of ``module``
    (fake_board("orin-nano-jp62") is an Orin Nano 8GB)."""
    from cuvil_edge.bundle.engine_key import EngineKey
    from cuvil_edge.models import build_digits_cnn
    from cuvil_edge.packager.engine_plan import make_build_plan
    from cuvil_edge.targets import get_target

    t = get_target("orin-nano-8gb")
    plan = make_build_plan(build_digits_cnn(), PLAN_FIELDS, t, next(r for r in t.releases if r.jetpack == "6.2"))
    key = EngineKey.from_dict(plan["engine_key"])
    return EngineKey(module, key.l4t, key.tensorrt, key.sm, key.dla_core, key.plan).slug


KEY_SLUG = bundle_key_slug()


def make_engine_bundle(out: Path, secret_key: Path, version: str, model: Path, name: str = "digits") -> Path:
    """A signed Orin Nano (JetPack 6.2) bundle of ``model`` with its engine build plans and a real sample."""
    import io

    import numpy as np
    import onnxruntime as ort

    from cuvil_edge.bundle import write_bundle
    from cuvil_edge.models.digits import load_digits_data
    from cuvil_edge.packager.engine_plan import make_build_plan, plan_member_name
    from cuvil_edge.targets import get_target

    x, _ = load_digits_data()
    sample = x[:4]
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    logits = sess.run(["logits"], {"input": sample})[0]

    def npz(**arrays: np.ndarray) -> bytes:
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        return buf.getvalue()

    t = get_target("orin-nano-8gb")
    releases = [r for r in t.releases if r.jetpack == "6.2"]
    manifest = {
        "name": name, "version": version,
        "target": {"name": t.name, "arch": t.arch, "gpu_sm": t.gpu_sm, "releases": [r.__dict__ for r in releases]},
        **PLAN_FIELDS, "format_kind": "tensorrt",
        "outputs": [{"name": "logits", "dtype": "float32", "shape": [-1, 10]}],
        "preprocess": {"kind": "none"}, "postprocess": {"kind": "none"},
        "validation": {"report": "validation.json", "sample_inputs": "sample/inputs.npz",
                       "sample_expected": "sample/expected.npz", "rtol": 1e-3, "atol": 1e-3},
        "engines": [], "build_plans": [],
    }
    members: dict[str, Path | bytes] = {"model.onnx": model, "validation.json": b"{}",
                                        "sample/inputs.npz": npz(input=sample),
                                        "sample/expected.npz": npz(logits=logits)}
    for release in releases:
        plan = make_build_plan(model, manifest, t, release)
        members[plan_member_name(plan)] = json.dumps(plan, indent=2).encode()
        manifest["build_plans"].append({"tensorrt": release.tensorrt, "path": plan_member_name(plan)})
    out.parent.mkdir(parents=True, exist_ok=True)
    write_bundle(out, manifest, members, secret_key)
    return out


def second_model(path: Path) -> Path:
    """The digits CNN with one weight changed: same graph, another sha256 (a retrained model)."""
    import onnx
    from onnx import numpy_helper

    from cuvil_edge.models import build_digits_cnn

    model = onnx.load(str(build_digits_cnn()))
    init = model.graph.initializer[0]
    arr = numpy_helper.to_array(init).copy()
    arr.flat[0] += 1e-3
    init.CopyFrom(numpy_helper.from_array(arr, init.name))
    onnx.save(model, str(path))
    return path


class Board:
    """Loopback Jetson stand-ins: sshd + a root showing Orin Nano / JetPack 6.2 facts + cuvil-edged."""

    def __init__(self, workdir: Path, keys: dict[str, Path]) -> None:
        self.workdir, self.keys = workdir, keys
        self.devices: list[SshDevice] = []
        self.daemons: dict[str, Daemon] = {}
        self.known_hosts = workdir / "known_hosts"

    def device(self, name: str, daemon: bool = True, kind: str = "orin-nano-jp62") -> SshDevice:
        from cuvil_edge.deploy._asyncssh import asyncssh

        pub = asyncssh.read_private_key(str(self.keys["client"])).export_public_key().decode().strip()
        dev = start_sshd(self.workdir, name, pub)
        fake_board(dev.root, kind)
        self.devices.append(dev)
        write_known_hosts(self.known_hosts, self.devices)
        if daemon:
            self.daemons[name] = Daemon(dev.store, self.keys["public"],
                                        args=("--root", str(dev.root), "--engine-standin", "1")).start()
        return dev

    def args(self, dev: SshDevice, to: str = "--to") -> list[str]:
        d = self.daemons.get(dev.name)
        return [to, f"root@127.0.0.1:{dev.port}", "--identity", str(self.keys["client"]), "--known-hosts",
                str(self.known_hosts), "--root", str(dev.root), "--store", str(dev.store),
                "--daemon-port", str(d.port if d else 1)]

    def address(self, dev: SshDevice):  # noqa: ANN201 - DeviceAddress
        d = self.daemons.get(dev.name)
        return dev.address(self.keys["client"], self.known_hosts, d.port if d else 1)

    def close(self) -> None:
        for d in self.daemons.values():
            d.stop()
        for dev in self.devices:
            dev.stop()
