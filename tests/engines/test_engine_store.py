"""Engine store, device keys, the stand-in builder and runtime, the device build and the daemon's choice.

No SSH here: these run the pieces in-process or as the device would run them (the stand-in builder
is a real subprocess). ``test_engines_loopback.py`` runs them together over real sshd and daemons.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from engine_harness import KEY_SLUG, PLAN_FIELDS, fake_board, make_engine_bundle, second_model

from cuvil_edge.bundle.engine_key import EngineKey
from cuvil_edge.bundle.engine_store import (
    EngineError,
    EngineRecord,
    EngineStore,
    host_engine_cache,
    key_for_facts,
    sha256_bytes,
)
from cuvil_edge.deploy.probe import DeviceFacts, probe_local
from cuvil_edge.packager.engine_device import RECORD_PREFIX, build_into_store
from cuvil_edge.packager.engine_plan import make_build_plan
from cuvil_edge.packager.engine_standin import STANDIN_MAGIC, read_standin_plan, standin_plan_bytes
from cuvil_edge.runtime.trt_select import choose_engine
from cuvil_edge.targets import get_target

SHA_A = "a" * 64
SHA_B = "b" * 64


def _record(key: EngineKey, model_sha: str, plan: bytes, builder: str = "standin") -> EngineRecord:
    return EngineRecord(key=key, model_sha256=model_sha, plan_sha256=sha256_bytes(plan), plan_size=len(plan),
                        builder=builder)


@pytest.fixture()
def key() -> EngineKey:
    return EngineKey.from_dict({"module": "orin-nano-8sm-8gb", "l4t": "36.4.3", "tensorrt": "10.3.0", "sm": "8.7",
                                "dla_core": None, "plan": KEY_SLUG.rsplit("plan-", 1)[1]})


def _plan_for(model: Path, target: str = "orin-nano-8gb", jetpack: str = "6.2", **fields) -> dict:
    t = get_target(target)
    return make_build_plan(model, {**PLAN_FIELDS, **fields}, t, next(r for r in t.releases if r.jetpack == jetpack))


class TestKeys:
    def test_key_from_facts(self, digits_model):
        facts = DeviceFacts(arch="aarch64", profile="orin-nano-8gb", l4t="36.4.3", tensorrt="10.3.0")
        plan = _plan_for(digits_model)
        assert key_for_facts(facts, plan).slug == KEY_SLUG
        assert key_for_facts(facts, plan, tensorrt="10.3.0.30").slug == KEY_SLUG

    def test_modules_of_one_sm_get_different_keys(self, digits_model):
        """Orin Nano 8GB and AGX Orin 64GB are both SM 8.7: one bundle's engines must still differ."""
        plan = _plan_for(digits_model)
        nano = DeviceFacts(arch="aarch64", profile="orin-nano-8gb", l4t="36.4.3", tensorrt="10.3.0")
        agx = DeviceFacts(arch="aarch64", profile="agx-orin-64gb", l4t="36.4.3", tensorrt="10.3.0")
        k_nano, k_agx = key_for_facts(nano, plan), key_for_facts(agx, plan)
        assert k_nano != k_agx and k_nano.slug != k_agx.slug
        assert (k_nano.module, k_agx.module) == ("orin-nano-8sm-8gb", "agx-orin-16sm-64gb")
        assert EngineStore(Path("/c")).timing_cache_path(k_nano) != EngineStore(Path("/c")).timing_cache_path(k_agx)

    def test_repackaging_changes_the_key(self, digits_model):
        facts = DeviceFacts(arch="aarch64", profile="orin-nano-8gb", l4t="36.4.3", tensorrt="10.3.0")
        base = key_for_facts(facts, _plan_for(digits_model))
        for change in ({"precision": "fp16"}, {"max_batch": 4}):  # max batch sizes the profiles
            other = key_for_facts(facts, _plan_for(digits_model, **change))
            assert other.plan != base.plan, change
        assert key_for_facts(facts, _plan_for(digits_model)) == base  # deterministic

    @pytest.mark.parametrize("facts", [DeviceFacts(arch="x86_64", profile="x86-host"),
                                       DeviceFacts(arch="aarch64", profile="orin-nano-8gb", l4t="36.4.3"),
                                       DeviceFacts(arch="aarch64", profile="generic-arm64", l4t="36.4.3",
                                                   tensorrt="10.3.0")])
    def test_no_key_without_jetpack_or_gpu(self, facts, digits_model):
        with pytest.raises(EngineError, match="no engine key for this device"):
            key_for_facts(facts, _plan_for(digits_model))

    def test_local_facts_of_a_fake_board(self, tmp_path, digits_model):
        fake_board(tmp_path, "orin-nano-jp62")
        assert key_for_facts(probe_local(str(tmp_path)), _plan_for(digits_model)).slug == KEY_SLUG


class TestEngineStore:
    def test_put_then_verify(self, tmp_path, key):
        store = EngineStore(tmp_path)
        plan = b"plan bytes"
        store.put(_record(key, SHA_A, plan), plan, b"log\n", b"timing")
        rec = store.verify(key, SHA_A)
        assert rec.plan_sha256 == sha256_bytes(plan) and rec.is_standin
        assert store.plan_path(key, SHA_A) == tmp_path / KEY_SLUG / f"{SHA_A}.plan"
        assert store.timing_cache_path(key).read_bytes() == b"timing"
        assert [r.model_sha256 for r in store.records()] == [SHA_A]

    def test_refuses_a_record_for_another_model(self, tmp_path, key):
        store = EngineStore(tmp_path)
        plan = b"plan for model A"
        store.put(_record(key, SHA_A, plan), plan)
        # Someone copies model A's engine to the name of model B.
        for suffix in (".plan", ".json"):
            src = store.key_dir(key) / f"{SHA_A}{suffix}"
            (store.key_dir(key) / f"{SHA_B}{suffix}").write_bytes(src.read_bytes())
        with pytest.raises(EngineError, match=r"built from model sha256 aaaaaaaaaaaa\.\.\., but the bundle's "
                                              r"model is bbbbbbbbbbbb\.\.\.; refused"):
            store.verify(key, SHA_B)

    def test_refuses_a_corrupt_plan_and_another_key(self, tmp_path, key):
        store = EngineStore(tmp_path)
        plan = b"x" * 100
        store.put(_record(key, SHA_A, plan), plan)
        store.plan_path(key, SHA_A).write_bytes(b"y" * 100)
        with pytest.raises(EngineError, match="corrupt engine refused"):
            store.verify(key, SHA_A)
        other = EngineKey("orin-nano-8sm-8gb", "36.3.0", "8.6.2", "8.7", None, "0123456789ab")
        with pytest.raises(EngineError, match="no engine for key"):
            store.verify(other, SHA_A)
        (tmp_path / other.slug).mkdir()
        (tmp_path / other.slug / f"{SHA_A}.json").write_text((tmp_path / KEY_SLUG / f"{SHA_A}.json").read_text())
        with pytest.raises(EngineError, match="built for key orin-nano-8sm-8gb_l4t-36.4.3"):
            store.verify(other, SHA_A)

    def test_put_refuses_bytes_that_do_not_match(self, tmp_path, key):
        store = EngineStore(tmp_path)
        with pytest.raises(EngineError, match="do not match"):
            store.put(_record(key, SHA_A, b"one"), b"two")
        assert store.find(key, SHA_A) is None and not store.plan_path(key, SHA_A).exists()
        with pytest.raises(EngineError, match="sha256"):
            store.plan_path(key, "../../etc/passwd")

    def test_host_cache_follows_the_environment(self, tmp_path, monkeypatch):
        monkeypatch.setenv("CUVIL_EDGE_ENGINE_CACHE", str(tmp_path / "c"))
        assert host_engine_cache().root == tmp_path / "c"
        monkeypatch.delenv("CUVIL_EDGE_ENGINE_CACHE")
        monkeypatch.setenv("CUVIL_EDGE_CACHE", str(tmp_path / "base"))
        assert host_engine_cache().root == tmp_path / "base" / "engines"


class TestStandinBuilder:
    def test_executable_writes_engine_log_and_timing_cache(self, tmp_path, digits_model):
        out, timing = tmp_path / "e.plan", tmp_path / "t.cache"
        proc = subprocess.run([sys.executable, "-m", "cuvil_edge.packager.engine_standin", f"--onnx={digits_model}",
                               f"--saveEngine={out}", f"--timingCacheFile={timing}", "--fp16",
                               "--standin-seconds=0.2"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        lines = proc.stdout.splitlines()
        assert lines[0].startswith("&&&& RUNNING TensorRT.trtexec [TensorRT v100300] [STAND-IN, not TensorRT]")
        assert lines[-1].startswith("&&&& PASSED") and any("Timing layer" in ln for ln in lines)
        header, onnx = read_standin_plan(out.read_bytes())
        assert onnx == digits_model.read_bytes() and header["flags"] == ["fp16"]
        assert "not a TensorRT plan" in header["note"]
        assert json.loads(timing.read_text())["entries"] > 0

    def test_bad_model_fails_like_trtexec(self, tmp_path):
        bad = tmp_path / "bad.onnx"
        bad.write_bytes(b"not onnx")
        proc = subprocess.run([sys.executable, "-m", "cuvil_edge.packager.engine_standin", f"--onnx={bad}",
                               f"--saveEngine={tmp_path / 'e'}"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1 and "&&&& FAILED" in proc.stdout and not (tmp_path / "e").exists()

    def test_plan_format_refuses_tampering(self):
        data = standin_plan_bytes(b"onnx bytes", {"tensorrt": "10.3.0"})
        assert data.startswith(STANDIN_MAGIC)
        with pytest.raises(ValueError, match="corrupt"):
            read_standin_plan(data[:-1] + b"X")
        with pytest.raises(ValueError, match="not a stand-in engine"):
            read_standin_plan(b"\x00real TensorRT plan")


def _plan_file(tmp_path: Path, model: Path, jetpack: str = "6.2") -> Path:
    target = get_target("orin-nano-8gb")
    release = next(r for r in target.releases if r.jetpack == jetpack)
    plan = make_build_plan(model, PLAN_FIELDS, target, release)
    path = tmp_path / f"plan-{jetpack}.json"
    path.write_text(json.dumps(plan))
    return path


class TestDeviceBuild:
    def test_builds_into_the_store_through_the_standin(self, tmp_path, digits_model):
        root = tmp_path / "root"
        fake_board(root, "orin-nano-jp62")
        lines: list[str] = []
        rec = build_into_store(_plan_file(tmp_path, digits_model), digits_model, tmp_path / "store", root=str(root),
                               builder="standin", echo=lines.append, standin_seconds=0.2)
        assert rec.key.slug == KEY_SLUG and rec.builder == "standin"
        assert lines[0].startswith("cuvil-edge engine build: pid ") and "pgid" in lines[0]
        assert lines[-1].startswith(RECORD_PREFIX)
        store = EngineStore(tmp_path / "store" / "engines")
        assert store.verify(rec.key, rec.model_sha256) == rec
        log = store.log_path(rec.key, rec.model_sha256).read_bytes()
        assert sha256_bytes(log) == rec.builder_log_sha256 and b"&&&& PASSED" in log
        assert not (store.root / ".build").exists()

    def test_refuses_a_plan_for_another_tensorrt_and_a_wrong_model(self, tmp_path, digits_model):
        root = tmp_path / "root"
        fake_board(root, "orin-nano-jp62")
        with pytest.raises(EngineError, match="plan is for TensorRT 8.6"):
            build_into_store(_plan_file(tmp_path, digits_model, "6.0"), digits_model, tmp_path / "s", str(root),
                             "standin")
        other = second_model(tmp_path / "other.onnx")
        with pytest.raises(EngineError, match="is not the model the plan was made for"):
            build_into_store(_plan_file(tmp_path, digits_model), other, tmp_path / "s", str(root), "standin")
        assert not (tmp_path / "s" / "engines").exists() or not list((tmp_path / "s" / "engines").rglob("*.plan"))
        # The other build (``engine build --out``) makes the same check with the same error class.
        from cuvil_edge.packager.engine_build import build_engine

        with pytest.raises(EngineError, match="is not the model the plan was made for"):
            build_engine(_plan_file(tmp_path, digits_model), other, tmp_path / "e.plan")

    def test_tensorrt_builder_says_what_to_install(self, tmp_path, digits_model):
        root = tmp_path / "root"
        fake_board(root, "orin-nano-jp62")
        with pytest.raises(Exception, match="pip install cuvil-edge\\[jetson\\]"):
            build_into_store(_plan_file(tmp_path, digits_model), digits_model, tmp_path / "s", str(root))


class TestDaemonChoice:
    @pytest.fixture()
    def device(self, tmp_path, digits_model, engine_keys):
        from cuvil_edge.bundle import extract_bundle

        root = tmp_path / "root"
        fake_board(root, "orin-nano-jp62")
        bundle = make_engine_bundle(tmp_path / "b.cvb", engine_keys["secret"], "1.0.0", digits_model)
        bdir = tmp_path / "store/bundles/digits/1.0.0"
        manifest = extract_bundle(bundle, bdir, engine_keys["public"]).to_dict()
        # The bundle's own plan: the daemon keys engines by the plan it finds in the bundle.
        return {"root": str(root), "bundle_dir": bdir, "manifest": manifest, "engines": tmp_path / "store/engines",
                "plan": bdir / "engine/plan-trt10.3.0.json", "store": tmp_path / "store"}

    def _choose(self, d, **kw):
        return choose_engine(d["engines"], d["bundle_dir"], d["manifest"], root=d["root"], **kw)

    def test_fallbacks_say_why(self, device, tmp_path):
        assert "no engine for key" in self._choose(device, allow_standin=True).reason
        x86 = tmp_path / "x86"
        x86.mkdir()
        assert "no engine key for this device" in choose_engine(device["engines"], device["bundle_dir"],
                                                                device["manifest"], root=str(x86)).reason
        cpu = {**device["manifest"], "format_kind": "ort-cpu"}
        assert "not for TensorRT" in choose_engine(device["engines"], device["bundle_dir"], cpu).reason

    def test_standin_engine_is_served_only_when_allowed(self, device, digits_model):
        from cuvil_edge.runtime import BackendOptions
        from cuvil_edge.runtime.trt_select import backend_for_choice

        build_into_store(device["plan"], digits_model, device["store"], device["root"], "standin",
                         echo=lambda _line: None, standin_seconds=0.1)
        refused = self._choose(device)
        assert refused.backend == "onnxruntime" and "STAND-IN" in refused.reason
        choice = self._choose(device, allow_standin=True)
        assert (choice.backend, choice.engine_key, choice.builder) == ("tensorrt-standin", KEY_SLUG, "standin")
        backend = backend_for_choice(choice, device["manifest"], BackendOptions())
        x = np.random.default_rng(0).standard_normal((3, 1, 8, 8)).astype(np.float32)
        with backend:
            got = backend.infer({"input": x})["logits"]
        import onnxruntime as ort

        want = ort.InferenceSession(str(digits_model), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5)
        assert backend.kind == "tensorrt-standin"

    def test_corrupt_engine_is_refused(self, device, digits_model):
        rec = build_into_store(device["plan"], digits_model, device["store"], device["root"], "standin",
                               echo=lambda _line: None, standin_seconds=0.1)
        plan = EngineStore(device["engines"]).plan_path(rec.key, rec.model_sha256)
        data = bytearray(plan.read_bytes())
        data[-1] ^= 0xFF
        plan.write_bytes(bytes(data))
        choice = self._choose(device, allow_standin=True)
        assert choice.backend == "onnxruntime" and choice.refused and "corrupt engine refused" in choice.reason


def test_engine_build_help_and_bad_arguments(cli, tmp_path):
    res = cli("engine", "build", "--help")
    assert res.returncode == 0 and "--on" in res.stdout and "standin" in res.stdout
    res = cli("engine", "build", str(tmp_path / "b.cvb"))
    assert res.returncode == 1 and "needs --on DEVICE" in res.stderr
    res = cli("engine", "build", "--on", "root@127.0.0.1:1", str(tmp_path / "b.cvb"))
    assert res.returncode == 1 and "--pub" in res.stderr
    res = cli("engine", "build", "--plan", "p.json", "--onnx", "m.onnx")
    assert res.returncode == 1 and "exactly one of --store" in res.stderr
