"""Deploy to one device: real sshd per device, a daemon behind the health gate."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cuvil_edge.deploy.device import DeployOptions, deploy_device, prepare_bundle, rollback_device
from cuvil_edge.deploy.transport import run_sync
from cuvil_edge.errors import SignatureError


def _store_state(store: Path, name: str = "digits") -> dict:
    return json.loads((store / "deploy/state" / f"{name}.json").read_text())


class TestDeployDevice:
    def test_fresh_install_then_upgrade(self, lab, bundles, deploy_keys):
        dev = lab.device("dev0")
        addr = lab.address(dev)
        b1 = prepare_bundle(bundles["v1"], deploy_keys["public"])
        r = run_sync(deploy_device(b1, addr))
        assert r.status == "deployed", r.reason
        assert r.bytes_sent == b1.size
        assert os.readlink(dev.store / "bundles/digits/current") == "1.0.0"
        assert (dev.store / "bundles/digits/1.0.0/model.onnx").is_file()
        assert not any((dev.store / "deploy/uploads").iterdir())
        assert lab.daemons["dev0"].get("/v2/models/digits/versions/1.0.0/ready")[0] == 200

        b2 = prepare_bundle(bundles["v2"], deploy_keys["public"])
        r = run_sync(deploy_device(b2, addr))
        assert r.status == "deployed", r.reason
        assert r.previous == "1.0.0"
        assert os.readlink(dev.store / "bundles/digits/current") == "1.1.0"
        assert lab.daemons["dev0"].get("/v2/models/digits/versions/1.1.0/ready")[0] == 200
        assert _store_state(dev.store)["previous"] == "1.0.0"
        assert r.health and r.health["ok"] and r.health["outputs_checked"] == ["logits"]

    def test_same_bundle_twice_sends_nothing(self, lab, bundles, deploy_keys):
        dev = lab.device("dev0")
        b1 = prepare_bundle(bundles["v1"], deploy_keys["public"])
        first = run_sync(deploy_device(b1, lab.address(dev)))
        assert first.status == "deployed" and first.bytes_sent == b1.size
        again = run_sync(deploy_device(b1, lab.address(dev)))
        assert again.status == "unchanged"
        assert again.bytes_sent == 0

    def test_reinstall_of_present_version_sends_nothing(self, lab, bundles, deploy_keys):
        """Going back to a version still on the device switches without an upload."""
        dev = lab.device("dev0")
        addr = lab.address(dev)
        b1 = prepare_bundle(bundles["v1"], deploy_keys["public"])
        b2 = prepare_bundle(bundles["v2"], deploy_keys["public"])
        assert run_sync(deploy_device(b1, addr)).status == "deployed"
        assert run_sync(deploy_device(b2, addr)).status == "deployed"
        r = run_sync(deploy_device(b1, addr))
        assert r.status == "deployed" and r.bytes_sent == 0
        assert os.readlink(dev.store / "bundles/digits/current") == "1.0.0"

    def test_bad_signature_refused_before_upload(self, lab, bundles, deploy_keys):
        dev = lab.device("dev0", daemon=False)
        with pytest.raises(SignatureError):
            prepare_bundle(bundles["other_signer"], deploy_keys["public"])
        assert not (dev.store / "bundles").exists()

    def test_tampered_bundle_refused_before_upload(self, tmp_path, bundles, deploy_keys):
        import tarfile

        with tarfile.open(bundles["v1"]) as tar:
            offset = tar.getmember("model.onnx").offset_data
        data = bytearray(bundles["v1"].read_bytes())
        data[offset + 100] ^= 0xFF  # one bit pattern inside the model
        bad = tmp_path / "tampered.cvb"
        bad.write_bytes(bytes(data))
        from cuvil_edge.errors import BundleError

        with pytest.raises(BundleError):
            prepare_bundle(bad, deploy_keys["public"])

    def test_wrong_architecture_refused(self, lab, bundles, deploy_keys):
        from deploy_harness import fake_board

        arm = lab.device("arm0", daemon=False)
        fake_board(arm.root, "aarch64")
        r = run_sync(deploy_device(prepare_bundle(bundles["v1"], deploy_keys["public"]), lab.address(arm)))
        assert r.status == "refused"
        assert "x86_64" in r.reason and "aarch64" in r.reason
        assert r.bytes_sent == 0 and not (arm.store / "deploy/uploads").exists()

        x86 = lab.device("x86", daemon=False)
        r = run_sync(deploy_device(prepare_bundle(bundles["orin"], deploy_keys["public"]), lab.address(x86)))
        assert r.status == "refused" and "aarch64" in r.reason
        assert not (x86.store / "deploy").exists()

    def test_jetson_release_checked(self, lab, bundles, deploy_keys):
        """An Orin bundle for JetPack 6.2 passes the device check on a 6.2 board, not on a 6.0 one."""
        from deploy_harness import fake_board

        old = lab.device("jp60", daemon=False)
        fake_board(old.root, "orin-nano-jp6")
        orin = prepare_bundle(bundles["orin"], deploy_keys["public"])
        r = run_sync(deploy_device(orin, lab.address(old)))
        assert r.status == "refused" and "36.3.0" in r.reason and "8.6.2" in r.reason
        new = lab.device("jp62", daemon=False)
        fake_board(new.root, "orin-nano-jp62")
        r = run_sync(deploy_device(orin, lab.address(new), DeployOptions(health_timeout=1)))
        # The device check passes; there is no daemon on this fake board, so the gate fails
        # and the fresh install is taken back.
        assert r.facts["profile"] == "orin-nano-8gb" and r.facts["l4t"] == "36.4.3"
        assert r.facts["tensorrt"] == "10.3.0"
        assert r.status == "rolled-back" and "not reachable" in r.reason
        assert not (new.store / "bundles/digits/current").is_symlink()
        # With no current link a daemon would serve the only version left: it must be gone.
        assert not (new.store / "bundles/digits/3.0.0").exists()
        assert (new.store / "deploy/quarantine/digits/3.0.0/manifest.json").is_file()
        again = run_sync(deploy_device(orin, lab.address(new), DeployOptions(health_timeout=1)))
        assert again.status == "rolled-back" and again.bytes_sent == 0
        assert any("quarantine" in n for n in again.notes)

    @pytest.mark.parametrize("warmup", ["true", "false"])
    def test_failing_health_gate_rolls_back(self, lab, bundles, deploy_keys, warmup):
        """With warm-up the daemon itself refuses the load; without, the gate's sample check fails."""
        dev = lab.device("dev0", daemon_args=("--warmup", warmup))
        addr = lab.address(dev)
        good = prepare_bundle(bundles["v1"], deploy_keys["public"])
        assert run_sync(deploy_device(good, addr)).status == "deployed"
        bad = prepare_bundle(bundles["bad_health"], deploy_keys["public"])
        r = run_sync(deploy_device(bad, addr, DeployOptions(health_timeout=20)))
        assert r.status == "rolled-back"
        if warmup == "true":
            assert "load of digits failed" in r.reason
        else:
            assert "validation sample mismatch on output 'logits'" in r.reason
        assert os.readlink(dev.store / "bundles/digits/current") == "1.0.0"
        daemon = lab.daemons["dev0"]
        assert daemon.get("/v2/models/digits/versions/1.0.0/ready")[0] == 200
        assert daemon.get("/v2/models/digits/versions/2.0.0/ready")[0] != 200
        assert any("passes its health gate" in n for n in r.notes)
        events = [e["event"] for e in _store_state(dev.store)["events"]]
        assert events[-1] == "rollback"

    def test_rollback_command_and_keep_n(self, lab, bundles, deploy_keys):
        dev = lab.device("dev0")
        addr = lab.address(dev)
        for key in ("v1", "v2", "v3", "v4"):
            r = run_sync(deploy_device(prepare_bundle(bundles[key], deploy_keys["public"]), addr,
                                       DeployOptions(keep=2)))
            assert r.status == "deployed", r.reason
        present = sorted(p.name for p in (dev.store / "bundles/digits").iterdir() if not p.is_symlink())
        assert present == ["1.2.0", "1.3.0"]  # keep=2: current and previous stay, older go
        r = run_sync(rollback_device(addr, "digits"))
        assert r.status == "deployed", r.reason
        assert os.readlink(dev.store / "bundles/digits/current") == "1.2.0"
        assert lab.daemons["dev0"].get("/v2/models/digits/versions/1.2.0/ready")[0] == 200


class TestDeviceLock:
    def test_busy_device_refused_stale_lock_taken_over(self, lab, bundles, deploy_keys):
        import time

        dev = lab.device("dev0")
        b1 = prepare_bundle(bundles["v1"], deploy_keys["public"])
        lock = dev.store / "deploy/lock"
        lock.parent.mkdir(parents=True)
        lock.write_text(json.dumps({"host": "other-laptop", "pid": 4242, "since": time.time(),
                                    "expires": time.time() + 600, "at": "now"}))
        r = run_sync(deploy_device(b1, lab.address(dev)))
        assert r.status == "refused" and "busy" in r.reason and "other-laptop" in r.reason
        assert not (dev.store / "bundles/digits").exists()
        lock.write_text(json.dumps({"host": "other-laptop", "pid": 4242, "since": 0, "expires": 1, "at": "then"}))
        r = run_sync(deploy_device(b1, lab.address(dev)))
        assert r.status == "deployed", r.reason
        assert not lock.exists()
