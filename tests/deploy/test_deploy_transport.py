"""The SSH transport leaves nothing open behind it: no half-made connection, no port forward."""

from __future__ import annotations

import asyncio
import socket
import urllib.request

import pytest

from cuvil_edge.deploy.transport import SSHTransport, Unreachable, run_sync


def test_connect_without_sftp_closes_the_connection(lab):
    dev = lab.device("nosftp", daemon=False, sftp=False)
    tr = SSHTransport(lab.address(dev))
    with pytest.raises(Unreachable, match="nosftp|127.0.0.1"):
        run_sync(tr.connect())
    assert tr.conn is None and tr.sftp is None


def test_port_forward_reaches_the_daemon_and_closes_on_exit(lab):
    dev = lab.device("dev0")
    addr = lab.address(dev)

    def live(port: int) -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/live", timeout=10) as r:
            return r.status

    def refused(port: int) -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        except ConnectionRefusedError:
            return True
        return False

    async def use_forward() -> tuple[int, bool]:
        # Blocking HTTP runs in a thread: the loop must run to pump the forward.
        async with SSHTransport(addr) as tr:
            async with tr.forward_local(addr.daemon_port) as port:
                status = await asyncio.to_thread(live, port)
            # The SSH connection is still open here: only the forward itself is gone.
            return status, await asyncio.to_thread(refused, port)

    assert run_sync(use_forward()) == (200, True)
