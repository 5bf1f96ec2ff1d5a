"""One store layout for the daemon and deploy (``cuvil_edge/bundle/layout.py``).

What deploy writes on a device (over SFTP and with its device-side step), the daemon's store
reads, and the other way round: same paths, same ``current`` link, same idea of which entries
are versions. The loopback device is a real sshd over a real store directory; the daemon's side
is the daemon's own :class:`~cuvil_edge.daemon.store.BundleStore`.
"""

from __future__ import annotations

import os
from pathlib import Path

from cuvil_edge.bundle import activation
from cuvil_edge.bundle.layout import StoreLayout
from cuvil_edge.daemon.store import BundleStore
from cuvil_edge.deploy.activate import _versions_by_age
from cuvil_edge.deploy.device import deploy_device, prepare_bundle, rollback_device
from cuvil_edge.deploy.layout import DeviceLock, DeviceStore
from cuvil_edge.deploy.transport import DeviceAddress, SSHTransport, run_sync
from cuvil_edge.errors import DaemonError, DeployError


def test_daemon_store_and_deploy_name_the_same_paths(tmp_path):
    """Path by path, the daemon's store, deploy's SFTP store and the device step's rules agree
    (a DeviceStore only names paths until it connects)."""
    root = tmp_path / "store"
    tr = SSHTransport(DeviceAddress("127.0.0.1", store=str(root)))
    remote, daemon = DeviceStore(tr), BundleStore(root)
    assert str(daemon.bundles) == remote.layout.bundles_dir == str(root / "bundles")
    daemon_dir = daemon.bundles / "digits" / "1.0.0"
    assert remote.version_dir("digits", "1.0.0") == str(daemon_dir)
    assert remote.current_link("digits") == str(root / "bundles/digits/current")
    assert remote.state_path("digits") == activation.state_path(root, "digits") == str(root / "deploy/state/digits.json")
    assert DeviceLock(tr).path == StoreLayout.of(root).lock_path == str(root / "deploy/lock")
    assert remote.quarantine_dir("digits", "1.0.0") == str(root / "deploy/quarantine/digits/1.0.0")
    # One rule for unsafe names, each side raising its own error.
    for bad in ("../x", "current", "current.new", ".current.1-ab.tmp"):
        try:
            remote.version_dir("digits", bad)
        except DeployError:
            pass
        else:
            raise AssertionError(f"deploy accepted version {bad!r}")
        try:
            daemon.path("digits", bad)
        except DaemonError:
            pass
        else:
            raise AssertionError(f"the daemon accepted version {bad!r}")


def _store_with(tmp_path: Path, bundles: dict[str, Path], pub: Path) -> tuple[Path, BundleStore]:
    root = tmp_path / "dev" / "store"
    root.mkdir(parents=True)
    bs = BundleStore(root)
    bs.install(bundles["v1"], public_key=pub)
    bs.install(bundles["v2"], public_key=pub, make_current=False)
    return root, bs


def test_switches_by_either_side_read_the_same_by_both(tmp_path, bundles, deploy_keys):
    """The device step's switch (what ``ondevice activate`` runs) and the daemon store's switch
    write one link that both read; a swap link left by a switch that died is no version for either."""
    root, bs = _store_with(tmp_path, bundles, deploy_keys["public"])
    assert bs.current("digits") == activation.current_version(root, "digits") == "1.0.0"

    activation.switch_current(root, "digits", "1.1.0")  # the device-side deploy step
    assert bs.current("digits") == "1.1.0"
    assert bs.path("digits") == root / "bundles/digits/1.1.0"
    assert bs.manifest("digits").version == "1.1.0"  # typed, read through the one parser

    bs.set_current("digits", "1.0.0")  # the daemon's store (tests, the demo)
    assert activation.current_version(root, "digits") == "1.0.0"
    assert os.readlink(root / "bundles/digits/current") == "1.0.0"  # relative: one path component

    # A switcher killed between its link and the rename leaves its swap link; an older release
    # left ``current.new``. Neither is a version to the daemon or to the device step's pruning.
    bdir = root / "bundles/digits"
    os.symlink("1.1.0", bdir / f".current.{os.getpid() + 1}-deadbeef.tmp")
    os.symlink("1.1.0", bdir / "current.new")
    assert bs.versions("digits") == ["1.0.0", "1.1.0"]
    assert sorted(_versions_by_age(str(root), "digits", activation.read_state(root, "digits"))) == ["1.0.0", "1.1.0"]
    # Only the planted links remain beside the versions: a switch leaves no swap link behind.
    activation.switch_current(root, "digits", "1.1.0")
    leftovers = sorted(p.name for p in bdir.iterdir() if p.name.startswith(".current."))
    assert leftovers == [f".current.{os.getpid() + 1}-deadbeef.tmp"]


def test_deploy_over_ssh_and_the_daemon_store_agree(lab, bundles, deploy_keys):
    """Deploy (SFTP upload, device step over SSH) installs and switches; the daemon's store reads
    exactly that. The daemon's store switches back; deploy's SFTP view reads exactly that."""
    dev = lab.device("dev0")
    addr = lab.address(dev)
    b1 = prepare_bundle(bundles["v1"], deploy_keys["public"])
    b2 = prepare_bundle(bundles["v2"], deploy_keys["public"])
    assert run_sync(deploy_device(b1, addr)).status == "deployed"
    r = run_sync(deploy_device(b2, addr))
    assert r.status == "deployed", r.reason

    bs = BundleStore(dev.store)
    assert bs.current("digits") == "1.1.0"
    assert bs.versions("digits") == ["1.0.0", "1.1.0"]
    assert bs.manifest("digits").to_bytes() == b2.manifest.to_bytes()

    async def remote_view() -> tuple[str | None, list[str], bytes | None]:
        async with SSHTransport(addr) as tr:
            store = DeviceStore(tr)
            return (await store.current("digits"), sorted(await store.versions("digits")),
                    await store.manifest_bytes("digits", "1.0.0"))

    bs.set_current("digits", "1.0.0")
    current, versions, manifest = run_sync(remote_view())
    assert (current, versions) == ("1.0.0", ["1.0.0", "1.1.0"])
    assert manifest == b1.manifest_bytes

    # And a rollback by deploy (device step over SSH) lands where the daemon's store looks.
    back = run_sync(rollback_device(addr, "digits", "1.1.0"))
    assert back.status in ("deployed", "rolled-back"), back.reason
    assert bs.current("digits") == "1.1.0"
    assert not [p for p in (dev.store / "bundles/digits").iterdir() if p.name.startswith(".current.")]


def _probe(root: Path, store: Path, manifest: bytes, *extra: str) -> tuple[int, dict]:
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "cuvil_edge.deploy.ondevice", "probe", "--root", str(root),
                          "--store", str(store), *extra], input=manifest, capture_output=True, timeout=120)
    return out.returncode, json.loads(out.stdout)


def test_the_probe_names_the_store_paths_for_shell_callers(tmp_path, bundles, deploy_keys):
    """The Ansible role acts with shell commands; the device-side probe hands it every path from
    the layout, and refuses an unsafe name with the one parser before naming any."""
    import json

    from cuvil_edge.bundle import verify_bundle

    root, bs = _store_with(tmp_path, bundles, deploy_keys["public"])
    manifest = verify_bundle(bundles["v2"], deploy_keys["public"]).to_bytes()
    sha = "ab" * 32
    rc, out = _probe(tmp_path, root, manifest, "--sha256", sha)
    assert rc == 0, out
    assert out["current"] == bs.current("digits") == "1.0.0"
    paths = out["paths"]
    assert paths["version_dir"] == str(bs.path("digits", "1.1.0"))
    assert paths["bundle_dir"] == str(root / "bundles/digits")
    assert paths["upload"] == str(root / f"deploy/uploads/{sha}.cvb")
    assert paths["staging_root"] == str(root / "deploy/staging")
    assert paths["state_dir"] == str(Path(activation.state_path(root, "digits")).parent)

    evil = json.loads(manifest)
    evil["version"] = "../../../escaped"
    rc, out = _probe(tmp_path, root, json.dumps(evil).encode())
    assert rc == 1 and not out["ok"] and "not a safe directory name" in out["reason"] and "paths" not in out
    rc, out = _probe(tmp_path, root, manifest, "--sha256", "../x")
    assert rc == 1 and not out["ok"] and "--sha256" in out["reason"]
