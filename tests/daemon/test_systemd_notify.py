"""sd_notify over a real AF_UNIX datagram socket; watchdog interval; progress-gated pings."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cuvil_edge.daemon import systemd


class NotifySocket:
    """A datagram socket standing where systemd's notify socket would."""

    def __init__(self, sock: socket.socket, env_value: str) -> None:
        self.sock = sock
        self.env_value = env_value

    def recv(self, timeout: float = 5.0) -> str:
        self.sock.settimeout(timeout)
        return self.sock.recv(65536).decode()

    def empty(self) -> bool:
        self.sock.settimeout(0.05)
        try:
            self.sock.recv(65536)
        except TimeoutError:
            return True
        return False


@pytest.fixture
def notify_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[NotifySocket]:
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    try:
        yield NotifySocket(sock, str(path))
    finally:
        sock.close()


class TestNotify:
    def test_ready_status_and_mainpid(self, notify_socket: NotifySocket) -> None:
        assert systemd.ready("serving 2 models\non 127.0.0.1:8000")
        msg = notify_socket.recv()
        assert msg.split("\n") == ["READY=1", f"MAINPID={os.getpid()}", "STATUS=serving 2 models on 127.0.0.1:8000"]

    def test_each_message_kind(self, notify_socket: NotifySocket) -> None:
        assert systemd.status("loading models")
        assert notify_socket.recv() == "STATUS=loading models"
        assert systemd.watchdog_ping()
        assert notify_socket.recv() == "WATCHDOG=1"
        assert systemd.stopping("draining")
        assert notify_socket.recv() == "STOPPING=1\nSTATUS=draining"
        assert systemd.reloading()
        lines = notify_socket.recv().split("\n")
        assert lines[0] == "RELOADING=1" and lines[1].startswith("MONOTONIC_USEC=")

    def test_abstract_socket(self, monkeypatch: pytest.MonkeyPatch) -> None:
        name = f"cuvil-test-{uuid.uuid4().hex}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind("\0" + name)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        try:
            assert systemd.notify("READY=1")
            sock.settimeout(5)
            assert sock.recv(100) == b"READY=1"
        finally:
            sock.close()

    def test_outside_systemd_is_a_noop(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
        assert systemd.notify("READY=1") is False
        assert systemd.ready() is False

    def test_dead_socket_does_not_raise(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone.sock"))
        assert systemd.notify("READY=1") is False
        monkeypatch.setenv("NOTIFY_SOCKET", "relative/path")
        assert systemd.notify("READY=1") is False

    def test_unset_environment(self, notify_socket: NotifySocket) -> None:
        assert systemd.notify("READY=1", unset_environment=True)
        assert "NOTIFY_SOCKET" not in os.environ
        assert notify_socket.recv() == "READY=1"

    def test_malformed_assignment(self, notify_socket: NotifySocket) -> None:
        with pytest.raises(ValueError, match="KEY=VALUE"):
            systemd.notify("READY=1\nSTATUS=x")
        with pytest.raises(ValueError):
            systemd.notify("READY")
        assert notify_socket.empty()


class TestWatchdogInterval:
    def test_from_environment(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("WATCHDOG_USEC", "30000000")
        monkeypatch.delenv("WATCHDOG_PID", raising=False)
        assert systemd.watchdog_interval_s() == 30.0
        monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
        assert systemd.watchdog_interval_s() == 30.0
        monkeypatch.setenv("WATCHDOG_PID", "1")  # meant for another process
        assert systemd.watchdog_interval_s() is None
        monkeypatch.setenv("WATCHDOG_USEC", "0")
        assert systemd.watchdog_interval_s() is None
        monkeypatch.delenv("WATCHDOG_USEC")
        assert systemd.watchdog_interval_s() is None


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class TestWatchdog:
    def test_pings_only_on_progress_at_half_the_timeout(self, notify_socket: NotifySocket,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("WATCHDOG_USEC", "4000000")
        monkeypatch.delenv("WATCHDOG_PID", raising=False)
        clock = FakeClock()
        wd = systemd.Watchdog(clock=clock)
        assert wd.enabled and wd.interval_s == 2.0
        assert wd.tick() is False  # no progress recorded yet
        wd.progress()
        assert wd.tick() is True and notify_socket.recv() == "WATCHDOG=1"
        wd.progress()
        clock.t += 1.0
        assert wd.tick() is False  # not due yet
        clock.t += 1.5
        assert wd.tick() is True and notify_socket.recv() == "WATCHDOG=1"
        clock.t += 5.0  # the serving loop stalled: no progress() since the last ping
        assert wd.tick() is False
        assert notify_socket.empty()
        assert (wd.pings, wd.skipped) == (2, 2)

    def test_a_stuck_batch_stops_the_pings(self, notify_socket: NotifySocket) -> None:
        clock = FakeClock()
        wd = systemd.Watchdog(interval_s=1.0, stuck_after_s=10.0, clock=clock)
        wd.progress(oldest_batch_s=2.0)
        assert wd.tick()
        notify_socket.recv()
        clock.t += 1.0
        wd.progress(oldest_batch_s=12.0)  # the loop ticks, but one inference hangs
        assert not wd.tick()
        assert notify_socket.empty()

    def test_disabled_without_watchdog(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv("WATCHDOG_USEC", raising=False)
        wd = systemd.Watchdog()
        wd.progress()
        assert not wd.enabled and wd.tick() is False


def test_daemon_lifecycle_through_the_notify_socket(notify_socket: NotifySocket, tmp_path: Path) -> None:
    """The real cuvil-edged, started as systemd would (NOTIFY_SOCKET, WATCHDOG_USEC), reports
    READY=1, pings the watchdog while it serves and says STOPPING=1 on SIGTERM."""
    exe = Path(sys.executable).parent / "cuvil-edged"
    if not exe.exists():
        pytest.skip("cuvil-edged console script not installed (pip install -e .)")
    store = tmp_path / "store"
    store.mkdir()
    env = dict(os.environ, NOTIFY_SOCKET=notify_socket.env_value, WATCHDOG_USEC="2000000")
    env.pop("WATCHDOG_PID", None)
    proc = subprocess.Popen(
        [str(exe), "--store", str(store), "--host", "127.0.0.1", "--port", "0",
         "--telemetry", "sim:orin-nano-8gb", "--tick", "0.2"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        seen: list[str] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and sum(m == "WATCHDOG=1" for m in seen) < 2:
            seen.append(notify_socket.recv(timeout=max(0.1, deadline - time.monotonic())))
        ready = [m for m in seen if m.startswith("READY=1") or "\nREADY=1" in m]
        assert ready, seen
        assert seen.index(ready[0]) < seen.index("WATCHDOG=1")  # no ping before READY
        proc.send_signal(signal.SIGTERM)
        rest = []
        while not any("STOPPING=1" in m for m in rest):
            rest.append(notify_socket.recv(timeout=20))
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
