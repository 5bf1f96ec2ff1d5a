"""Deploy as a device-side transaction: the link is cut at every step after the upload, the
daemon is killed mid-switch, and the device still ends on a gated version that its state file names.

Real sshd and a real daemon per device (``deploy_harness``); a :class:`LinkProxy` between the host
and the device's sshd drops the connection on demand; the device-side step's test-only pause hook
(``CUVIL_EDGE_TEST_PAUSE_DIR``, set for the test devices' SSH sessions) makes the cut land at a
named step.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import time
from pathlib import Path

import pytest
from deploy_harness import Daemon, LinkProxy

from cuvil_edge.deploy.device import DeployOptions, deploy_device, device_status, prepare_bundle
from cuvil_edge.deploy.transport import run_sync

STEPS = ["before-switch", "after-switch", "gate", "outcome"]
# Roomy for a loaded 2-core CI machine; the gate of the digits model takes well under a second.
OPTS = DeployOptions(health_timeout=30, confirm_deadline=60)


def _state(dev) -> dict:
    return json.loads((dev.store / "deploy/state/digits.json").read_text())


def _current(dev) -> str | None:
    link = dev.store / "bundles/digits/current"
    return os.readlink(link) if link.is_symlink() else None


async def _until(predicate, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


def _settled(dev, txn: str) -> bool:
    try:
        st = _state(dev)
    except (OSError, ValueError):
        return False
    out = st.get("outcome") or {}
    return not st.get("pending") and out.get("txn") == txn and bool(out.get("complete"))


@contextlib.asynccontextmanager
async def _held_at(lab, dev, bundle, step: str, options: DeployOptions):
    """Deploy ``bundle`` through a cuttable proxy and hold the device step at ``step``; yields
    ``(proxy, task, flag)`` once the step is there (unlink ``flag`` to release it). The task is
    cancelled and the proxy closed on the way out."""
    proxy = LinkProxy(dev.port)
    await proxy.start()
    with open(lab.known_hosts, "a") as f:
        f.write(f"[127.0.0.1]:{proxy.port} {dev.host_pub}\n")
    flag, reached = dev.pause_dir / f"{step}.pause", dev.pause_dir / f"{step}.reached"
    reached.unlink(missing_ok=True)
    flag.touch()
    addr = dataclasses.replace(lab.address(dev), port=proxy.port)
    task = asyncio.ensure_future(deploy_device(bundle, addr, options))
    try:
        await _until(reached.exists, 120, f"the device step to reach {step}")
        yield proxy, task, flag
    finally:
        flag.unlink(missing_ok=True)
        if not task.done():
            task.cancel()
        await proxy.close()


async def _deploy_cut_at(lab, dev, bundle, step: str, heal_after: float | None, options: DeployOptions):
    """Deploy through a proxy, cut the link when the device step reaches ``step``, release the step,
    and heal the link after ``heal_after`` seconds (None: never, the host gives up)."""
    async with _held_at(lab, dev, bundle, step, options) as (proxy, task, flag):
        proxy.cut()
        flag.unlink()
        if heal_after is not None:
            await asyncio.sleep(heal_after)
            proxy.heal()
        result = await asyncio.wait_for(task, 240)
    assert proxy.cuts >= 1
    return result


def _assert_truthful(lab, dev, new: str, old: str) -> str:
    """The device serves ``new`` marked healthy or ``old``, and its state file says which."""
    st = _state(dev)
    assert st["pending"] is None
    cur = _current(dev)
    daemon = lab.daemons[dev.name]
    if cur == new:
        assert st["versions"][new]["healthy"] is True
        assert st["outcome"]["status"] == "deployed" and st["outcome"]["serving"] == new
    else:
        assert cur == old, cur
        assert st["outcome"]["status"] in ("rolled-back", "reverted") and st["outcome"]["serving"] == old
    assert daemon.get(f"/v2/models/digits/versions/{cur}/ready")[0] == 200
    return cur


@pytest.mark.parametrize("step", STEPS)
def test_link_cut_after_upload_device_ends_on_a_gated_version(lab, bundles, deploy_keys, step):
    dev = lab.device("dev0")
    addr = lab.address(dev)
    b1, b2, b3 = (prepare_bundle(bundles[k], deploy_keys["public"]) for k in ("v1", "v2", "v3"))
    assert run_sync(deploy_device(b1, addr, OPTS)).status == "deployed"

    async def scenario():
        # 1. The link comes back while the device works: the host reconnects and reads the outcome.
        healed = await _deploy_cut_at(lab, dev, b2, step, heal_after=1.0, options=OPTS)
        # 2. The link stays down: the host gives up; the device finishes by itself.
        lost = await _deploy_cut_at(lab, dev, b3, step, heal_after=None,
                                    options=dataclasses.replace(OPTS, reconnect_for=2.0))
        return healed, lost

    healed, lost = run_sync(scenario())
    assert healed.status == "deployed", healed.reason
    assert any("link dropped" in n for n in healed.notes)
    assert _current(dev) in ("1.1.0", "1.2.0")

    assert lost.status == "unreachable", lost.reason
    assert "reverts an unconfirmed switch by" in lost.reason
    deadline = time.monotonic() + OPTS.confirm_deadline + 10
    run_sync(_until(lambda: _settled(dev, lost.txn), OPTS.confirm_deadline + 10, "the device's outcome"))
    assert time.monotonic() < deadline
    served = _assert_truthful(lab, dev, "1.2.0", "1.1.0")
    assert served == "1.2.0"  # the gate passes on this device: the device confirmed it by itself

    # The next deploy adopts the outcome it did not see; status tells the same.
    again = run_sync(deploy_device(b3, addr, OPTS))
    assert again.status == "deployed" and again.bytes_sent == 0
    assert any("adopted the outcome" in n for n in again.notes), again.notes
    assert _state(dev)["outcome"]["seen"] is True
    assert run_sync(deploy_device(b3, addr, OPTS)).status == "unchanged"
    status = run_sync(device_status(addr))
    model = status["models"][0]
    assert (model["current"], model["healthy"], model["pending"]) == ("1.2.0", True, None)


def test_link_cut_during_a_failing_gate_leaves_old_version_and_next_deploy_says_so(lab, bundles, deploy_keys):
    dev = lab.device("dev0", daemon_args=("--warmup", "false"))
    addr = lab.address(dev)
    good = prepare_bundle(bundles["v1"], deploy_keys["public"])
    bad = prepare_bundle(bundles["bad_health"], deploy_keys["public"])
    assert run_sync(deploy_device(good, addr, OPTS)).status == "deployed"
    lost = run_sync(_deploy_cut_at(lab, dev, bad, "gate", None, dataclasses.replace(OPTS, reconnect_for=2.0)))
    assert lost.status == "unreachable"
    run_sync(_until(lambda: _settled(dev, lost.txn), OPTS.confirm_deadline + 10, "the device's outcome"))
    assert _assert_truthful(lab, dev, "2.0.0", "1.0.0") == "1.0.0"
    again = run_sync(deploy_device(bad, addr, OPTS))
    assert again.status == "rolled-back" and "validation sample mismatch" in again.reason
    assert any("adopted the outcome" in n for n in again.notes)
    assert _current(dev) == "1.0.0"


@pytest.mark.parametrize("restart", ["before-deadline", "after-deadline"])
def test_daemon_killed_during_pending_switch_reverts_it(lab, bundles, deploy_keys, restart):
    """The device's userland crashes mid-switch (daemon and deploy step SIGKILLed); the daemon
    restarts as systemd would and reverts the unconfirmed switch: on its tick when it restarts
    before the deadline, at start when after."""
    dev = lab.device("dev0")
    addr = lab.address(dev)
    b1, b2 = (prepare_bundle(bundles[k], deploy_keys["public"]) for k in ("v1", "v2"))
    opts = DeployOptions(health_timeout=5, confirm_deadline=15, reconnect_for=1.0)
    assert run_sync(deploy_device(b1, addr, opts)).status == "deployed"
    daemon = lab.daemons["dev0"]

    async def scenario():
        async with _held_at(lab, dev, b2, "gate", opts) as (proxy, task, flag):
            pending = _state(dev)["pending"]
            assert pending["version"] == "1.1.0" and _current(dev) == "1.1.0"
            os.kill(int(pending["pid"]), signal.SIGKILL)
            daemon.proc.send_signal(signal.SIGKILL)
            daemon.proc.wait(10)
            proxy.cut()  # the host loses the device too
            flag.unlink()
            return await asyncio.wait_for(task, 60), pending

    host, pending = run_sync(scenario())
    assert host.status == "unreachable"
    assert _state(dev)["pending"]["txn"] == pending["txn"]  # nobody on the device confirmed it
    if restart == "after-deadline":
        time.sleep(max(0.0, pending["deadline"] - time.time()) + 0.5)
    daemon.stop()
    lab.daemons["dev0"] = restarted = Daemon(dev.store, deploy_keys["public"], port=daemon.port).start()
    if restart == "after-deadline":
        # Reverted at start, before the models load (the daemon answers only after the revert):
        # the unconfirmed version is never served again.
        assert _current(dev) == "1.0.0"
        assert _state(dev)["pending"] is None
    run_sync(_until(lambda: _settled(dev, pending["txn"]), 60, "the daemon's revert"))
    st = _state(dev)
    assert st["outcome"]["status"] == "reverted" and "deadline" in st["outcome"]["reason"]
    assert st["outcome"]["by"] == "cuvil-edged"
    assert _current(dev) == "1.0.0"
    run_sync(_until(lambda: restarted.get("/v2/models/digits/versions/1.0.0/ready")[0] == 200, 60,
                    "the daemon to serve 1.0.0 again"))
    assert restarted.get("/v2/models/digits/versions/1.1.0/ready")[0] != 200
    status = run_sync(device_status(addr))["models"][0]
    assert status["current"] == "1.0.0" and status["pending"] is None
    assert status["last_outcome"]["status"] == "reverted"


def test_status_shows_pending_switch_with_its_deadline(lab, bundles, deploy_keys):
    dev = lab.device("dev0")
    addr = lab.address(dev)
    b1, b2 = (prepare_bundle(bundles[k], deploy_keys["public"]) for k in ("v1", "v2"))
    assert run_sync(deploy_device(b1, addr, OPTS)).status == "deployed"
    flag, reached = dev.pause_dir / "gate.pause", dev.pause_dir / "gate.reached"
    flag.touch()

    async def scenario():
        task = asyncio.ensure_future(deploy_device(b2, addr, OPTS))
        try:
            await _until(reached.exists, 120, "the device step to reach the gate")
            status = await device_status(addr)
            second = asyncio.ensure_future(deploy_device(b2, addr, OPTS))
            await asyncio.sleep(1.5)
            assert not second.done()  # it waits for the device step of the first run
            flag.unlink()
            return status, await asyncio.wait_for(task, 120), await asyncio.wait_for(second, 120)
        finally:
            flag.unlink(missing_ok=True)

    status, first, second = run_sync(scenario())
    pending = status["models"][0]["pending"]
    assert pending["version"] == "1.1.0" and pending["previous"] == "1.0.0"
    assert pending["deadline_at"] and "cuvil-edge deploy" in pending["by"]
    assert first.status == "deployed"
    # A second run while the first one's device step works waits for it, then finds it done.
    assert second.status == "unchanged", second.reason


def test_device_python_without_cuvil_edge_fails_clearly_and_nothing_switches(lab, bundles, deploy_keys):
    dev = lab.device("dev0")
    addr = lab.address(dev)
    b1 = prepare_bundle(bundles["v1"], deploy_keys["public"])
    r = run_sync(deploy_device(b1, dataclasses.replace(addr, python="/opt/no-such-python/bin/python3"), OPTS))
    assert r.status == "failed"
    assert "--device-python" in r.reason
    assert _current(dev) is None
    assert not (dev.store / "deploy/lock").exists()
    assert run_sync(deploy_device(b1, addr, OPTS)).status == "deployed"


def test_pause_hook_is_off_without_its_variable(tmp_path: Path, monkeypatch):
    from cuvil_edge.deploy.activate import PAUSE_ENV, pause

    monkeypatch.delenv(PAUSE_ENV, raising=False)
    (tmp_path / "gate.pause").touch()
    t0 = time.monotonic()
    pause("gate")
    assert time.monotonic() - t0 < 1.0 and not (tmp_path / "gate.reached").exists()


def test_host_reconnecting_after_the_deadline_reverts_and_reports_what_the_device_serves(lab, bundles, deploy_keys):
    """The deploy step and the daemon die mid-switch and nothing on the device reverts (no systemd
    timer here, the daemon down); the host's link comes back after the deadline: the host reverts
    (it logs in as root) and reports the device serving the previous version, not "unreachable"."""
    dev = lab.device("dev0")
    addr = lab.address(dev)
    b1, b2 = (prepare_bundle(bundles[k], deploy_keys["public"]) for k in ("v1", "v2"))
    opts = DeployOptions(health_timeout=5, confirm_deadline=12, reconnect_for=40.0)
    assert run_sync(deploy_device(b1, addr, opts)).status == "deployed"
    daemon = lab.daemons["dev0"]

    async def scenario():
        async with _held_at(lab, dev, b2, "gate", opts) as (proxy, task, flag):
            pending = _state(dev)["pending"]
            os.kill(int(pending["pid"]), signal.SIGKILL)
            daemon.stop()
            proxy.cut()
            flag.unlink()
            await asyncio.sleep(max(0.0, pending["deadline"] - time.time()) + 1.0)
            assert _state(dev)["pending"]["txn"] == pending["txn"]  # still nobody reverted it
            proxy.heal()
            return await asyncio.wait_for(task, 120)

    host = run_sync(scenario())
    assert host.status == "rolled-back" and host.stage == "reverted", (host.status, host.reason)
    assert host.serving == "1.0.0" and _current(dev) == "1.0.0"
    st = _state(dev)
    assert st["pending"] is None and st["outcome"]["by"] == "ondevice revert-expired"
    lab.daemons["dev0"] = Daemon(dev.store, deploy_keys["public"], port=daemon.port).start()
