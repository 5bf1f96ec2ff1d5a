"""Fixtures for the deploy tests: loopback devices (real sshd + daemon), keys and bundles."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from deploy_harness import Daemon, SshDevice, make_bundle, make_key, start_sshd, write_known_hosts

from cuvil_edge.bundle.signing import generate_keypair
from cuvil_edge.deploy.transport import DeviceAddress


@pytest.fixture(scope="session")
def deploy_keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("deploy-keys")
    generate_keypair(d / "sign.key", d / "sign.pub")
    generate_keypair(d / "other.key", d / "other.pub")
    make_key(d / "client_ed25519")
    return {"secret": d / "sign.key", "public": d / "sign.pub", "other_secret": d / "other.key",
            "other_public": d / "other.pub", "client": d / "client_ed25519", "dir": d}


@pytest.fixture(scope="session")
def bundles(tmp_path_factory: pytest.TempPathFactory, deploy_keys: dict[str, Path]) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("deploy-bundles")
    sk = deploy_keys["secret"]
    return {
        "v1": make_bundle(d / "digits-1.0.0.cvb", sk, "1.0.0"),
        "v2": make_bundle(d / "digits-1.1.0.cvb", sk, "1.1.0"),
        "v3": make_bundle(d / "digits-1.2.0.cvb", sk, "1.2.0"),
        "v4": make_bundle(d / "digits-1.3.0.cvb", sk, "1.3.0"),
        "bad_health": make_bundle(d / "digits-2.0.0-bad.cvb", sk, "2.0.0", bad_expected=True),
        "padded": make_bundle(d / "digits-1.5.0-padded.cvb", sk, "1.5.0", padding=10 << 20),
        "other_signer": make_bundle(d / "digits-1.9.0-other.cvb", deploy_keys["other_secret"], "1.9.0"),
        "orin": make_bundle(d / "digits-3.0.0-orin.cvb", sk, "3.0.0", target="orin-nano-8gb", jetpack="6.2"),
    }


class Lab:
    """Loopback devices for one test; each has an sshd, a root and (optionally) a daemon."""

    def __init__(self, workdir: Path, keys: dict[str, Path]) -> None:
        self.workdir = workdir
        self.keys = keys
        self.devices: list[SshDevice] = []
        self.daemons: dict[str, Daemon] = {}
        self.known_hosts = workdir / "known_hosts"

    def device(self, name: str, daemon: bool = True, daemon_args: tuple[str, ...] = (),
               sftp: bool = True) -> SshDevice:
        pub = _client_pub(self.keys["client"])
        dev = start_sshd(self.workdir, name, pub, sftp=sftp)
        self.devices.append(dev)
        write_known_hosts(self.known_hosts, self.devices)
        if daemon:
            self.daemons[name] = Daemon(dev.store, self.keys["public"], args=daemon_args).start()
        return dev

    def address(self, dev: SshDevice, **changes: object) -> DeviceAddress:
        d = self.daemons.get(dev.name)
        addr = dev.address(self.keys["client"], self.known_hosts, d.port if d else 1)
        if changes:
            import dataclasses

            addr = dataclasses.replace(addr, **changes)
        return addr

    def close(self) -> None:
        for d in self.daemons.values():
            d.stop()
        for dev in self.devices:
            dev.stop()


def _client_pub(key: Path) -> str:
    from cuvil_edge.deploy._asyncssh import asyncssh

    return asyncssh.read_private_key(str(key)).export_public_key().decode().strip()


@pytest.fixture
def lab(tmp_path: Path, deploy_keys: dict[str, Path]) -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.skip("the loopback devices run sshd, which needs root (CI runs as root)")
    lab = Lab(tmp_path, deploy_keys)
    try:
        yield lab
    finally:
        lab.close()
        shutil.rmtree(tmp_path, ignore_errors=True)
