"""Every device write a later step relies on survives a power cut (issue 22).

The writes run for real on a temp store; :class:`faultfs.FaultFS` records their fsyncs and renames
and :meth:`faultfs.FaultFS.power_cut` leaves only what a journaling file system keeps after a cut.
Each test fails when one fsync the design needs is removed (checked by hand once per fsync).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest
from faultfs import FaultFS

from cuvil_edge import _atomic
from cuvil_edge.bundle import activation as act
from cuvil_edge.bundle import layout as lay
from cuvil_edge.bundle.container import verify_directory
from cuvil_edge.deploy import activate as dev_act
from cuvil_edge.deploy.unpack import UnpackError, unpack_upload


def _version(store: Path, name: str, version: str, payload: bytes = b"weights") -> Path:
    """A small verified version directory written straight into the store (no bundle needed)."""
    vdir = store / "bundles" / name / version
    vdir.mkdir(parents=True)
    (vdir / "model.onnx").write_bytes(payload)
    manifest = {"format": "cuvil-bundle/1", "name": name, "version": version, "files": [
        {"path": "model.onnx", "sha256": hashlib.sha256(payload).hexdigest(), "size": len(payload)}]}
    (vdir / "manifest.json").write_text(json.dumps(manifest))
    return vdir


class TestAtomicWrites:
    def test_the_fault_layer_catches_a_write_without_fsync(self, tmp_path, monkeypatch):
        fs = FaultFS(tmp_path).install(monkeypatch)
        (tmp_path / "f").write_bytes(b"old")
        fs.baseline()
        (tmp_path / "f.tmp").write_bytes(b"new")
        os.replace(tmp_path / "f.tmp", tmp_path / "f")  # neither the data nor the rename synced
        fs.power_cut()
        assert (tmp_path / "f").read_bytes() == b"old"
        (tmp_path / "g").write_bytes(b"data")
        _atomic.fsync_dir(tmp_path)  # the name is on the disk, its data is not
        fs.power_cut()
        assert (tmp_path / "g").read_bytes() == b""

    def test_atomic_write_survives_a_cut(self, tmp_path, monkeypatch):
        target = tmp_path / "sub" / "report.json"
        target.parent.mkdir()
        target.write_text("old")
        fs = FaultFS(tmp_path).install(monkeypatch)
        _atomic.atomic_write_text(target, "new")
        fs.power_cut()
        assert target.read_text() == "new"

    def test_fsync_tree_makes_a_tar_extraction_durable(self, tmp_path, monkeypatch):
        fs = FaultFS(tmp_path).install(monkeypatch)
        tree = tmp_path / "x"
        (tree / "a" / "b").mkdir(parents=True)
        (tree / "a" / "b" / "f").write_bytes(b"payload")
        (tree / "g").write_bytes(b"top")
        assert _atomic.fsync_tree(tree) == 2
        _atomic.fsync_dir(tmp_path)
        fs.power_cut()
        assert (tree / "a" / "b" / "f").read_bytes() == b"payload" and (tree / "g").read_bytes() == b"top"


class TestStoreWrites:
    def test_state_file_survives_a_cut(self, tmp_path, monkeypatch):
        store = tmp_path / "store"
        act.write_state(store, "m", act.empty_state("m"))
        fs = FaultFS(tmp_path).install(monkeypatch)
        state = act.empty_state("m")
        state["previous"] = "1.0.0"
        act.write_state(store, "m", state)
        fs.power_cut()
        assert act.read_state(store, "m")["previous"] == "1.0.0"

    def test_current_switch_survives_a_cut(self, tmp_path, monkeypatch):
        store = tmp_path / "store"
        _version(store, "m", "1.0.0")
        _version(store, "m", "1.1.0")
        layout = lay.StoreLayout.of(store)
        lay.point_current(layout, "m", "1.0.0")
        fs = FaultFS(tmp_path).install(monkeypatch)
        lay.point_current(layout, "m", "1.1.0")
        fs.power_cut()
        assert lay.read_current(layout, "m") == "1.1.0"
        lay.remove_current(layout, "m")
        fs.power_cut()
        assert lay.read_current(layout, "m") is None

    def test_lock_record_survives_a_cut(self, tmp_path, monkeypatch):
        store = tmp_path / "store"
        (store / "deploy").mkdir(parents=True)
        fs = FaultFS(tmp_path).install(monkeypatch)
        dev_act.take_lock(str(store), "txn1", time.time() + 60)
        fs.power_cut()
        assert json.loads((store / "deploy" / "lock").read_bytes())["txn"] == "txn1"


@pytest.fixture(scope="module")
def bundle_file(tmp_path_factory, deploy_keys) -> Path:
    from deploy_harness import make_bundle

    return make_bundle(tmp_path_factory.mktemp("durable") / "digits-1.0.0.cvb", deploy_keys["secret"], "1.0.0")


def _upload(store: Path, bundle: Path) -> tuple[str, str]:
    from cuvil_edge.bundle.container import MANIFEST_NAME, iter_member_bytes

    sha = hashlib.sha256(bundle.read_bytes()).hexdigest()
    up = store / "deploy" / "uploads" / f"{sha}.cvb"
    up.parent.mkdir(parents=True, exist_ok=True)
    up.write_bytes(bundle.read_bytes())
    manifest = dict(iter_member_bytes(bundle, {MANIFEST_NAME}))[MANIFEST_NAME]
    return sha, hashlib.sha256(manifest).hexdigest()


class TestUnpack:
    def test_unpacked_version_survives_a_cut(self, tmp_path, monkeypatch, bundle_file):
        store = tmp_path / "store"
        sha, msha = _upload(store, bundle_file)
        fs = FaultFS(tmp_path).install(monkeypatch)
        out = unpack_upload(str(store), "digits", "1.0.0", sha, msha)
        assert out["files"] >= 3
        lost = fs.power_cut()
        vdir = store / "bundles" / "digits" / "1.0.0"
        assert vdir.is_dir(), lost
        verify_directory(vdir)  # every byte of every file is there
        assert (vdir / "manifest.json.minisig").stat().st_size > 0

    def test_a_cut_during_extraction_leaves_no_version(self, tmp_path, monkeypatch, bundle_file):
        store = tmp_path / "store"
        sha, msha = _upload(store, bundle_file)
        fs = FaultFS(tmp_path).install(monkeypatch)

        class Cut(Exception):
            pass

        def cut(step: str) -> None:
            fs.power_cut()
            raise Cut(step)

        with pytest.raises(Cut):
            unpack_upload(str(store), "digits", "1.0.0", sha, msha, pause=cut)
        assert not (store / "bundles" / "digits" / "1.0.0").exists()
        # The next deploy unpacks again from the upload, which survived.
        assert unpack_upload(str(store), "digits", "1.0.0", sha, msha)["files"] >= 3

    def test_tampered_extraction_is_refused_and_leaves_nothing(self, tmp_path, bundle_file):
        store = tmp_path / "store"
        sha, _ = _upload(store, bundle_file)
        with pytest.raises(UnpackError, match="not the one the host verified"):
            unpack_upload(str(store), "digits", "1.0.0", sha, "0" * 64)
        assert not (store / "bundles" / "digits" / "1.0.0").exists()
        assert os.listdir(store / "deploy" / "staging") == []


class TestRecoverAndPrune:
    def _store(self, tmp_path: Path) -> Path:
        store = tmp_path / "store"
        for v in ("1.0.0", "1.1.0", "1.2.0"):
            _version(store, "m", v, payload=f"weights {v}".encode())
        state = act.empty_state("m")
        state["versions"] = {"1.0.0": {"healthy": True, "installed": "2026-01-01T00:00:00+00:00"},
                             "1.1.0": {"healthy": True, "installed": "2026-01-02T00:00:00+00:00"},
                             "1.2.0": {"healthy": True, "installed": "2026-01-03T00:00:00+00:00"}}
        state["previous"] = "1.1.0"
        act.write_state(store, "m", state)
        lay.point_current(lay.StoreLayout.of(store), "m", "1.2.0")
        return store

    def test_version_failing_verification_is_quarantined_and_current_goes_back(self, tmp_path):
        store = self._store(tmp_path)
        (store / "bundles/m/1.2.0/model.onnx").write_bytes(b"")  # what a cut before the fsync left
        report = act.recover_store(store)
        assert [q.split(":")[0] for q in report.quarantined] == ["m 1.2.0"]
        assert not (store / "bundles/m/1.2.0").exists()
        assert (store / "deploy/quarantine/.corrupt/m/1.2.0/manifest.json").is_file()
        assert act.current_version(store, "m") == "1.1.0"
        state = act.read_state(store, "m")
        assert state["versions"]["1.2.0"]["healthy"] is False
        assert act.recover_store(store).changed is False  # nothing more to do

    def test_recover_removes_staging_leftovers_of_gone_steps_only(self, tmp_path):
        store = self._store(tmp_path)
        staging = store / "deploy" / "staging"
        gone, live, fresh = staging / "m-1.3.0.999999999", staging / f"m-1.4.0.{os.getpid()}", staging / "m-1.5.0.999999998"
        for d in (gone, live, fresh):
            d.mkdir(parents=True)
        old = time.time() - 3600
        os.utime(gone, (old, old))
        os.utime(live, (old, old))
        report = act.recover_store(store)
        assert report.cleaned == [gone.name]
        assert not gone.exists() and live.exists() and fresh.exists()

    def test_prune_keeps_previous_and_newest_healthy_and_drops_unhealthy_first(self, tmp_path):
        store = self._store(tmp_path)
        _version(store, "m", "1.3.0")
        state = act.read_state(store, "m")
        state["versions"]["1.3.0"] = {"healthy": False, "installed": "2026-01-04T00:00:00+00:00"}
        state["versions"]["1.2.0"]["healthy"] = True
        removed = dev_act._prune(str(store), "m", state, 2, {"1.2.0", "1.1.0"})
        assert removed == ["1.3.0", "1.0.0"]
        assert sorted(os.listdir(store / "bundles/m")) == ["1.1.0", "1.2.0", "current"]

    def test_a_cut_during_prune_leaves_no_half_deleted_version(self, tmp_path, monkeypatch):
        store = self._store(tmp_path)
        fs = FaultFS(tmp_path).install(monkeypatch)
        state = act.read_state(store, "m")

        def cut(step: str) -> None:
            fs.power_cut()
            raise KeyboardInterrupt(step)

        monkeypatch.setattr(dev_act, "pause", cut)
        with pytest.raises(KeyboardInterrupt):
            dev_act._prune(str(store), "m", state, 1, {"1.2.0", "1.1.0"})
        layout = lay.StoreLayout.of(store)
        for v in os.listdir(store / "bundles/m"):
            if v != "current":
                assert act._verify_version(layout, "m", v) is None, v
        assert not (store / "bundles/m/1.0.0").exists()


# ------------------------------------------------------------------ issue 26, findings 7 and 9


@pytest.mark.parametrize("pending", [
    {"version": "../..", "previous": "1.0.0", "deadline": 0, "txn": "t"},
    "yes",
    {"version": "1.1.0", "previous": "1.0.0", "deadline": "soon", "txn": "t"},
])
def test_finding7_state_file_with_wrong_types_is_quarantined_not_acted_on(tmp_path, caplog, pending):
    store = tmp_path / "store"
    _version(store, "m", "1.0.0")
    _version(store, "m", "1.1.0")
    lay.point_current(lay.StoreLayout.of(store), "m", "1.1.0")
    path = store / "deploy/state/m.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"name": "m", "versions": {}, "events": [], "pending": pending}))
    assert act.revert_expired(store) == []  # no revert of a record we cannot trust, and no exception
    assert act.current_version(store, "m") == "1.1.0"  # current is untouched
    assert not path.exists() and list((store / "deploy/quarantine/.state").iterdir())
    assert sum("ignored" in r.getMessage() for r in caplog.records) == 1


def test_finding7_events_of_the_wrong_type_and_a_huge_state_file_cost_one_stat(tmp_path, monkeypatch):
    store = tmp_path / "store"
    path = store / "deploy/state/m.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"name": "m", "events": 5}))
    assert "unreadable" in act.read_state(store, "m")["notes"][0]
    with open(path, "wb") as f:  # sparse: 100 MB that a reader would have to parse
        f.truncate(100 << 20)
    # The daemon's view on a stock install: it may not move the file aside, so it meets it every round.
    monkeypatch.setattr(act, "_quarantine_state_file", lambda store, path: None)
    t0 = time.perf_counter()
    for _ in range(20):
        state = act.read_state(store, "m")
    assert time.perf_counter() - t0 < 1.0
    assert "more than" in state["notes"][0]
    assert act.expired_pending(store) == []


def test_finding7_daemon_revert_check_and_tick_survive_a_bad_state_file(tmp_path, monkeypatch):
    import asyncio

    from cuvil_edge.daemon import server as srv

    store = tmp_path / "store"
    (store / "deploy/state").mkdir(parents=True)
    (store / "deploy/state/m.json").write_text(json.dumps({"name": "m", "pending": {"version": "x"}}))

    class Cfg:
        pass

    server = srv.Server.__new__(srv.Server)
    server.config = Cfg()
    server.config.store = store
    server._revert_warned = False
    assert server.revert_expired_switches() is False
    # Whatever a round raises, the supervised tick loop starts again.
    rounds = []

    async def flaky() -> None:
        rounds.append(1)
        if len(rounds) < 3:
            raise TypeError("a tick that died")

    real_sleep = asyncio.sleep
    monkeypatch.setattr(srv.asyncio, "sleep", lambda s: real_sleep(0))
    asyncio.run(server._supervised(flaky, "tick"))
    assert len(rounds) == 3


def _take(store: str, txn: str, barrier, out) -> None:  # a child process of the finding-9 test
    barrier.wait()
    try:
        dev_act.take_lock(store, txn, time.time() + 600)
        out.put((txn, "won"))
    except dev_act.LockBusy as exc:
        out.put((txn, str(exc).split(":")[0]))
    barrier.wait()  # the winner stays alive until all tried: a gone holder may rightly be taken over


@pytest.mark.parametrize("stale", [b'{"expires": 1, "pid": 1, "host": "gone"}', b"\x00garbage"])
def test_finding9_concurrent_take_lock_on_a_stale_lock_has_one_winner(tmp_path, stale):
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    store = tmp_path / "store"
    lock = store / "deploy" / "lock"
    lock.parent.mkdir(parents=True)
    for round_ in range(6):
        lock.write_bytes(stale)
        barrier, out = ctx.Barrier(3), ctx.Queue()
        procs = [ctx.Process(target=_take, args=(str(store), f"txn{round_}{i}", barrier, out)) for i in range(3)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(30)
        results = sorted(out.get(timeout=5)[1] for _ in procs)
        assert results == ["busy", "busy", "won"], results
