"""Fleet rollout against loopback devices: canary, batches, failure share, re-runs."""

from __future__ import annotations

from deploy_harness import Daemon, refused_port

from cuvil_edge.deploy.device import DeployOptions, prepare_bundle
from cuvil_edge.deploy.fleet import RolloutPolicy, load_inventory, rollout
from cuvil_edge.deploy.transport import DeviceAddress, run_sync

# A dead daemon or a refused load fails at once; the timeout only bounds a slow (loaded) machine.
FAST = DeployOptions(health_timeout=30, connect_timeout=10)


def _fleet(lab, n, unreachable=(), no_daemon=()):
    """n devices; ``unreachable`` indexes get a closed port, ``no_daemon`` ones a dead daemon."""
    addrs = []
    for i in range(n):
        name = f"dev{i}"
        if i in unreachable:  # nothing listens on this port
            addrs.append(DeviceAddress(host="127.0.0.1", port=refused_port(), user="root", name=name,
                                       identity=str(lab.keys["client"]), known_hosts=str(lab.known_hosts)))
            continue
        dev = lab.device(name, daemon=i not in no_daemon)
        addrs.append(lab.address(dev))
    return addrs


class TestRollout:
    def test_fleet_with_unreachable_and_unhealthy_device(self, lab, bundles, deploy_keys, tmp_path):
        addrs = _fleet(lab, 6, unreachable={1}, no_daemon={2})
        b = prepare_bundle(bundles["v1"], deploy_keys["public"])
        policy = RolloutPolicy(concurrency=5, canary=1, batch_size=5, max_fail_share=0.5)
        report = run_sync(rollout(b, addrs, FAST, policy))
        status = {r.device: r.status for r in report.results}
        assert status == {"dev0": "deployed", "dev1": "unreachable", "dev2": "rolled-back",
                          "dev3": "deployed", "dev4": "deployed", "dev5": "deployed"}
        assert report.stopped == ""
        assert report.results[0].notes[0] == "canary"
        assert "not reachable" in report.results[2].reason
        report.write(tmp_path / "report.json")
        assert '"rolled-back": 1' in (tmp_path / "report.json").read_text()

        # The unhealthy device gets its daemon back; a re-run finishes only what is left.
        dev2 = next(d for d in lab.devices if d.name == "dev2")
        lab.daemons["dev2"] = Daemon(dev2.store, deploy_keys["public"]).start()
        addrs[2] = lab.address(dev2)
        again = run_sync(rollout(b, addrs, FAST, policy))
        status = {r.device: r.status for r in again.results}
        assert status == {"dev0": "unchanged", "dev1": "unreachable", "dev2": "deployed",
                          "dev3": "unchanged", "dev4": "unchanged", "dev5": "unchanged"}
        assert sum(r.bytes_sent for r in again.results) == 0  # dev2 kept the bundle after its rollback

    def test_failure_share_stops_rollout(self, lab, bundles, deploy_keys):
        addrs = _fleet(lab, 7, unreachable={1}, no_daemon={2})
        b = prepare_bundle(bundles["v1"], deploy_keys["public"])
        policy = RolloutPolicy(concurrency=3, canary=1, batch_size=3, max_fail_share=0.34)
        report = run_sync(rollout(b, addrs, FAST, policy))
        status = [r.status for r in report.results]
        assert status == ["deployed", "unreachable", "rolled-back", "deployed", "skipped", "skipped", "skipped"]
        assert "batch 1: 2 of 3 devices failed" in report.stopped
        for d in lab.devices:
            if d.name in ("dev4", "dev5", "dev6"):
                assert not (d.store / "bundles/digits").exists()

    def test_failing_canary_stops_everything(self, lab, bundles, deploy_keys):
        addrs = _fleet(lab, 4, unreachable={0})
        b = prepare_bundle(bundles["bad_health"], deploy_keys["public"])
        report = run_sync(rollout(b, addrs, FAST, RolloutPolicy(concurrency=4, canary=1)))
        status = [r.status for r in report.results]
        # dev0 is unreachable, so dev1 becomes the canary; it fails its gate and the rest wait.
        assert status == ["unreachable", "rolled-back", "skipped", "skipped"]
        assert report.stopped.startswith("canary dev1 rolled-back")


def test_load_inventory(tmp_path):
    inv = tmp_path / "fleet.toml"
    inv.write_text(
        '[defaults]\nuser = "root"\nstore = "/data/cuvil"\ndaemon_port = 8001\n\n'
        '[[device]]\naddress = "10.0.0.5:2222"\nname = "orin-01"\n\n'
        '[[device]]\naddress = "admin@10.0.0.6"\nroot = "/mnt/board"\n'
    )
    a, b = load_inventory(inv, known_hosts="")
    assert (a.host, a.port, a.user, a.name, a.store, a.daemon_port) == ("10.0.0.5", 2222, "root", "orin-01",
                                                                        "/data/cuvil", 8001)
    assert (b.user, b.port, b.root, b.label) == ("admin", 22, "/mnt/board", "admin@10.0.0.6:22")
    inv.write_text('[[device]]\naddress = "x"\nflavour = "mint"\n')
    import pytest

    from cuvil_edge.errors import DeployError

    with pytest.raises(DeployError, match="flavour"):
        load_inventory(inv)
