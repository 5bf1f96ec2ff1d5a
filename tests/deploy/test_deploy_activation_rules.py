"""The store's switch rules (``cuvil_edge/bundle/activation.py``) on a local store: when a pending
switch expires, what a revert does, and that the daemon side imports none of deploy's host side."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from cuvil_edge.bundle import activation as act


def _store(tmp_path: Path, versions=("1.0.0", "1.1.0"), current="1.1.0") -> Path:
    store = tmp_path / "store"
    for v in versions:
        d = store / "bundles/digits" / v
        d.mkdir(parents=True)
        (d / "manifest.json").write_text(json.dumps({"name": "digits", "version": v}))
    if current:
        os.symlink(current, store / "bundles/digits/current")
    return store


def _pending(store: Path, version="1.1.0", previous="1.0.0", deadline=None, boot=None) -> None:
    state = act.read_state(store, "digits")
    state["pending"] = {"txn": "abcd1234", "version": version, "previous": previous,
                        "deadline": time.time() + 60 if deadline is None else deadline,
                        "boot_id": boot or act.boot_id()}
    act.write_state(store, "digits", state)


class TestExpiry:
    def test_deadline_passed_or_other_boot_expires_else_not(self):
        now = 1000.0
        assert act.expired_reason({"deadline": 1001.0, "boot_id": "a"}, now, "a") is None
        assert "deadline" in act.expired_reason({"deadline": 999.0, "boot_id": "a"}, now, "a")
        assert "rebooted" in act.expired_reason({"deadline": 5000.0, "boot_id": "a"}, now, "b")
        # A record without a deadline cannot be confirmed any more: revert it.
        assert act.expired_reason({}, now, "a") is not None


class TestRevertExpired:
    def test_not_expired_left_alone(self, tmp_path):
        store = _store(tmp_path)
        _pending(store)
        assert act.revert_expired(store) == []
        assert os.readlink(store / "bundles/digits/current") == "1.1.0"
        assert act.read_state(store, "digits")["pending"]["txn"] == "abcd1234"

    def test_expired_switch_goes_back_to_previous(self, tmp_path):
        store = _store(tmp_path)
        _pending(store, deadline=time.time() - 1)
        done = act.revert_expired(store)
        assert [(r.name, r.version, r.previous) for r in done] == [("digits", "1.1.0", "1.0.0")]
        assert os.readlink(store / "bundles/digits/current") == "1.0.0"
        state = act.read_state(store, "digits")
        assert state["pending"] is None
        out = state["outcome"]
        assert (out["status"], out["txn"], out["serving"], out["seen"]) == ("reverted", "abcd1234", "1.0.0", False)
        assert state["events"][-1]["event"] == "revert"
        assert not list((store / "deploy/state").glob("*.tmp-*"))  # atomic write left nothing behind

    def test_other_boot_reverts_before_the_deadline(self, tmp_path):
        store = _store(tmp_path)
        _pending(store, boot="00000000-0000-0000-0000-000000000000")
        if act.boot_id() is None:
            return  # a kernel without boot_id: only the deadline applies
        assert len(act.revert_expired(store)) == 1
        assert os.readlink(store / "bundles/digits/current") == "1.0.0"

    def test_no_previous_quarantines_the_unconfirmed_version(self, tmp_path):
        store = _store(tmp_path, versions=("1.0.0",), current="1.0.0")
        _pending(store, version="1.0.0", previous=None, deadline=0)
        act.revert_expired(store)
        assert not (store / "bundles/digits/current").is_symlink()
        assert not (store / "bundles/digits/1.0.0").exists()  # a lone version would still be served
        assert (store / "deploy/quarantine/digits/1.0.0/manifest.json").is_file()

    def test_confirmation_and_revert_never_both_win(self, tmp_path):
        """The deploy step confirms under the state lock; a revert racing it sees no pending switch."""
        store = _store(tmp_path)
        _pending(store, deadline=time.time() + 0.3)
        confirmed = threading.Event()

        def confirm() -> None:
            with act.state_lock(store):
                state = act.read_state(store, "digits")
                time.sleep(0.6)  # the deadline passes while the confirmation holds the lock
                state["pending"] = None
                state["outcome"] = {"txn": "abcd1234", "status": "deployed"}
                act.write_state(store, "digits", state)
            confirmed.set()

        t = threading.Thread(target=confirm)
        t.start()
        time.sleep(0.1)
        assert act.revert_expired(store, now=time.time() + 10) == []  # waited for the lock, then nothing to do
        t.join()
        assert confirmed.is_set()
        assert os.readlink(store / "bundles/digits/current") == "1.1.0"
        assert act.read_state(store, "digits")["outcome"]["status"] == "deployed"

    def test_unreadable_state_file_is_not_fatal(self, tmp_path):
        store = _store(tmp_path)
        (store / "deploy/state").mkdir(parents=True)
        (store / "deploy/state/digits.json").write_text("{half")
        assert act.revert_expired(store) == []
        assert act.revert_expired(tmp_path / "no-store") == []


def test_daemon_side_imports_no_deploy_host_code():
    code = ("import sys, cuvil_edge.daemon.server, cuvil_edge.bundle.activation; "
            "bad = [m for m in sys.modules if m.startswith('cuvil_edge.deploy') or m == 'asyncssh']; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


class TestDeviceLockOnTheDevice:
    """``deploy/activate.py``'s side of ``<store>/deploy/lock``: handover by token, busy, stale."""

    def test_handover_busy_and_stale(self, tmp_path):
        import socket

        import pytest

        from cuvil_edge.deploy import activate

        store = str(tmp_path)
        lock = tmp_path / "deploy/lock"
        lock.parent.mkdir(parents=True)
        host_record = {"host": "laptop", "pid": 1, "expires": time.time() + 600, "token": "t0k3n", "where": "host"}
        lock.write_text(json.dumps(host_record))
        with pytest.raises(activate.LockBusy, match="laptop"):
            activate.take_lock(store, "txn00001", time.time() + 60)
        assert activate.take_lock(store, "txn00001", time.time() + 60, handover_token="t0k3n") == ""
        held = json.loads(lock.read_text())
        assert (held["txn"], held["where"]) == ("txn00001", "device")
        # A live process of this machine holds it: busy; once that process is gone: taken over.
        with pytest.raises(activate.LockBusy):
            activate.take_lock(store, "txn00002", time.time() + 60)
        proc = subprocess.Popen([sys.executable, "-c", "pass"])
        proc.wait()
        held.update(pid=proc.pid, host=socket.gethostname())
        lock.write_text(json.dumps(held))
        assert "gone" in activate.take_lock(store, "txn00002", time.time() + 60)
        activate.release_lock(store, "txn00001")  # not the holder: nothing happens
        assert lock.exists()
        activate.release_lock(store, "txn00002")
        assert not lock.exists()

    def test_wait_reports_a_transaction_that_never_started(self, tmp_path):
        from cuvil_edge.deploy.activate import wait_outcome

        store = _store(tmp_path)
        t0 = time.monotonic()
        out = wait_outcome(str(store), "digits", "neverstarted", timeout=30)
        assert out["state"] == "unknown" and out["current"] == "1.1.0"
        assert time.monotonic() - t0 < 10
