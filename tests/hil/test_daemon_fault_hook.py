"""The daemon's debug-only fault hook (the watchdog proof's trigger) is off unless asked for.

With ``CUVIL_EDGED_DEBUG_FAULT_HOOKS=1`` SIGUSR2 stalls the event loop: the process stays
alive but answers nothing, which is what systemd's watchdog must catch on the board. Without
it no handler exists and SIGUSR2 keeps its default action (the process dies of it).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _live(port: int, timeout: float) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/live", timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator:
    procs: list[subprocess.Popen[bytes]] = []

    def start(hooks: bool) -> tuple[subprocess.Popen[bytes], int, Path]:
        port = _free_port()
        env = {k: v for k, v in os.environ.items() if k != "CUVIL_EDGED_DEBUG_FAULT_HOOKS"}
        if hooks:
            env["CUVIL_EDGED_DEBUG_FAULT_HOOKS"] = "1"
        log = tmp_path / f"daemon-{port}.log"
        store = tmp_path / f"store-{port}"
        store.mkdir()
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "cuvil_edge.daemon.main", "--store", str(store),
                                     "--port", str(port), "--warmup", "0"], cwd=REPO, env=env,
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        procs.append(proc)
        deadline = time.monotonic() + 120
        while not _live(port, 2):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "daemon not live within 120 s"
            time.sleep(0.2)
        return proc, port, log

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(30)


def test_sigusr2_stalls_the_loop_only_with_the_hook_on(start_daemon) -> None:
    proc, port, log = start_daemon(True)
    assert "debug fault hooks on" in log.read_text()
    proc.send_signal(signal.SIGUSR2)
    deadline = time.monotonic() + 30
    while _live(port, 2) and time.monotonic() < deadline:  # the signal is handled on the loop's next turn
        time.sleep(0.2)
    assert not _live(port, 3)
    assert proc.poll() is None  # alive but stalled: only a watchdog can tell
    assert "stalling the event loop" in log.read_text()


def test_hook_is_off_by_default(start_daemon) -> None:
    proc, port, log = start_daemon(False)
    assert "fault hook" not in log.read_text()
    proc.send_signal(signal.SIGUSR2)
    assert proc.wait(30) == -signal.SIGUSR2  # no handler: the default action ends the process
