"""The transport seam: deploy, status and rollback through ``LocalTransport`` to a store on this machine.

The same deploy code a board gets over SSH (upload into ``.part`` files, sha256 on the "device", the
``ondevice`` step under the device lock, the health gate against a real ``cuvil-edged``) runs here with
no sshd, so it needs no root. The protocol test checks that every transport in the table provides the
whole :class:`Transport` surface and that deploy code names no implementation.
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import pytest
from deploy_harness import Daemon

import cuvil_edge
from cuvil_edge.deploy.device import (
    DeployOptions,
    deploy_device,
    device_status,
    prepare_bundle,
    rollback_device,
)
from cuvil_edge.deploy.local_transport import LocalTransport
from cuvil_edge.deploy.transport import SSHTransport, parse_address, run_sync
from cuvil_edge.deploy.transport_base import Transport
from cuvil_edge.deploy.transports import TRANSPORTS, open_transport
from cuvil_edge.errors import DeployError

DEPLOY = Path(cuvil_edge.__file__).resolve().parent / "deploy"


@pytest.fixture
def local_board(tmp_path, deploy_keys):
    root = tmp_path / "board"
    store = root / "var/lib/cuvil-edge"
    daemon = Daemon(store, deploy_keys["public"]).start()
    try:
        yield parse_address("local:board0", root=str(root), store=str(store), daemon_port=daemon.port,
                            python=sys.executable), daemon
    finally:
        daemon.stop()


class TestLocalTransport:
    def test_deploy_upgrade_status_and_rollback(self, local_board, bundles, deploy_keys):
        addr, daemon = local_board
        assert addr.transport == "local" and addr.label == "board0"
        store = Path(addr.store_root)
        b1 = prepare_bundle(bundles["v1"], deploy_keys["public"])
        r = run_sync(deploy_device(b1, addr))
        assert r.status == "deployed", r.reason
        assert r.bytes_sent == b1.size
        assert os.readlink(store / "bundles/digits/current") == "1.0.0"
        assert daemon.get("/v2/models/digits/versions/1.0.0/ready")[0] == 200
        assert run_sync(deploy_device(b1, addr)).status == "unchanged"

        b2 = prepare_bundle(bundles["v2"], deploy_keys["public"])
        r = run_sync(deploy_device(b2, addr))
        assert r.status == "deployed" and r.previous == "1.0.0", r.reason
        assert r.health and r.health["ok"]
        status = run_sync(device_status(addr, "digits", DeployOptions()))
        assert status["reachable"] and status["models"][0]["current"] == "1.1.0"

        back = run_sync(rollback_device(addr, "digits", None, DeployOptions()))
        assert back.status == "deployed" and back.version == "1.0.0", back.reason
        assert os.readlink(store / "bundles/digits/current") == "1.0.0"

    def test_a_missing_root_is_one_error_naming_it(self, tmp_path):
        addr = parse_address("local", root=str(tmp_path / "nowhere"))

        async def go() -> None:
            async with open_transport(addr):
                pass

        with pytest.raises(DeployError, match="nowhere is not a directory"):
            run_sync(go())


class TestTheSeam:
    @pytest.mark.parametrize("name", sorted(TRANSPORTS))
    def test_every_transport_provides_the_whole_protocol(self, name, tmp_path):
        address = parse_address("local" if name == "local" else "127.0.0.1", root=str(tmp_path))
        transport = TRANSPORTS[name](address, 1.0)
        assert isinstance(transport, Transport)
        wanted = {n for n in vars(Transport) if not n.startswith("_") or n in ("__aenter__", "__aexit__")}
        wanted -= {"address"}
        missing = sorted(n for n in wanted if not callable(getattr(transport, n, None)))
        assert missing == [], f"{name} lacks {missing}"

    def test_the_table_names_the_implementations(self):
        assert TRANSPORTS == {"ssh": SSHTransport, "local": LocalTransport}
        with pytest.raises(DeployError, match="unknown transport 'ota'.*ssh, local"):
            open_transport(parse_address("local").__class__(host="h", transport="ota"))

    def test_deploy_code_names_no_implementation(self):
        """Only the table constructs transports; everything else takes a Transport."""
        named = []
        for path in sorted(DEPLOY.glob("*.py")):
            if path.name in ("transport.py", "transports.py", "local_transport.py", "__init__.py"):
                continue
            for node in ast.walk(ast.parse(path.read_text("utf-8"))):
                if isinstance(node, ast.Name) and node.id in ("SSHTransport", "LocalTransport"):
                    named.append(f"{path.name}:{node.lineno}")
        assert named == []
