"""An unreachable ``ssh`` board falls back to ``qemu-system``, says so, and the report records it.

The decision is tested against a real closed loopback port (bound, never listening, so nothing
else can take it during the test). The same run end to end (boot included) runs with
``--hil-target``: ``pytest tests/hil/test_fallback.py --hil-target qemu-system``.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from hil.errors import HilError
from hil.runner import judge_journal_errors, resolve_target, run_suite, verdict


@pytest.fixture
def closed_port() -> Iterator[int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))  # bound but not listening: connections are refused
    try:
        yield int(s.getsockname()[1])
    finally:
        s.close()


def _targets(tmp_path: Path, port: int, fallback: bool = True) -> Path:
    path = tmp_path / "targets.toml"
    path.write_text(
        '[target.qemu-system]\nkind = "qemu-system"\ncpu = "cortex-a76"\n\n'
        f'[target.lab-orin]\nkind = "ssh"\nhost = "127.0.0.1"\nport = {port}\nconnect_timeout = 3\n'
        + ('fallback = "qemu-system"\n' if fallback else ""))
    return path


def test_unreachable_ssh_target_resolves_to_qemu_system(tmp_path: Path, closed_port: int) -> None:
    said: list[str] = []
    target, fb = resolve_target("lab-orin", _targets(tmp_path, closed_port), say=said.append)
    assert target.name == "qemu-system" and target.kind == "qemu-system"
    assert fb is not None and fb["from"] == "lab-orin" and fb["to"] == "qemu-system"
    assert f"127.0.0.1:{closed_port}" in fb["reason"]
    assert len(said) == 1 and "falling back to" in said[0] and "lab-orin" in said[0]


def test_reachable_ssh_target_is_used(tmp_path: Path) -> None:
    with socket.socket() as srv:  # a listener that greets like sshd
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        port = srv.getsockname()[1]
        import threading

        def greet() -> None:
            conn, _ = srv.accept()
            with conn:
                conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")

        t = threading.Thread(target=greet, daemon=True)
        t.start()
        target, fb = resolve_target("lab-orin", _targets(tmp_path, port))
        t.join(10)
    assert target.name == "lab-orin" and fb is None


def test_unreachable_without_fallback_is_an_error(tmp_path: Path, closed_port: int) -> None:
    with pytest.raises(HilError, match="names no fallback"):
        resolve_target("lab-orin", _targets(tmp_path, closed_port, fallback=False))


def test_a_run_on_the_fallback_fails_unless_allowed() -> None:
    fb = {"from": "lab-orin", "to": "qemu-system", "reason": "no SSH server answers"}
    passed = {"passed": 5, "failed": 0, "fallback": fb}
    refused = verdict(passed)
    assert refused["ok"] is False and "--allow-fallback" in refused["fallback_refused"]
    assert verdict(passed, allow_fallback=True) == {"ok": True}
    assert verdict({"passed": 5, "failed": 0, "fallback": None}) == {"ok": True}
    assert verdict({"passed": 5, "failed": 1, "fallback": None}) == {"ok": False}


def test_daemon_error_lines_fail_unless_a_check_declared_them() -> None:
    lines = ["2026-12-04 10:00:00 ERROR cuvil_edge.daemon: model m not served: boom",
             "2026-12-04 10:00:01 ERROR cuvil_edge.daemon: cannot revert pending deploy switches: Permission denied"]
    judged = judge_journal_errors(lines, [r"model m not served"])
    assert judged == {"expected": lines[:1], "unexplained": lines[1:]}


@pytest.mark.hil
@pytest.mark.slow
def test_fallback_run_boots_qemu_system_and_reports_it(tmp_path: Path, closed_port: int, hil_target: str) -> None:
    """End to end: the run boots the emulated board and its report says it fell back."""
    report_path = tmp_path / "r.json"
    report = run_suite("lab-orin", "boot", report_path, targets_path=_targets(tmp_path, closed_port),
                       allow_fallback=True)
    on_disk = json.loads(report_path.read_text())
    assert on_disk["ran_on"] == "qemu-system" and on_disk["fallback"]["from"] == "lab-orin"
    assert report["ok"] and on_disk["arch"] == "aarch64"
