"""Test hooks live in one module (``cuvil_edge/_test_hooks.py``) and nothing shipped switches them on."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import cuvil_edge
from cuvil_edge import _test_hooks
from cuvil_edge._test_hooks import HOOK_ENVS, PAUSE_ENV, fault_hooks_enabled, pause

PACKAGE = Path(cuvil_edge.__file__).resolve().parent


def test_no_shipped_file_names_a_hook_but_the_hook_module():
    """The unit, the install path, the Ansible role and every module reach the hooks only by import."""
    named = []
    for path in sorted(PACKAGE.rglob("*")):
        if not path.is_file() or path.suffix not in (".py", ".service", ".yml", ".yaml", ".toml", ".md", ".j2"):
            continue
        if path == Path(_test_hooks.__file__).resolve():
            continue
        text = path.read_text("utf-8", errors="replace")
        named += [f"{path.relative_to(PACKAGE)}: {env}" for env in HOOK_ENVS if env in text]
    assert named == []


def test_the_unit_never_enables_a_hook():
    unit = (PACKAGE / "daemon" / "units" / "cuvil-edged.service").read_text("utf-8")
    assert "Environment=" not in unit or not any(env in unit for env in HOOK_ENVS)


def test_pause_is_a_no_op_unless_set(monkeypatch, tmp_path):
    monkeypatch.delenv(PAUSE_ENV, raising=False)
    monkeypatch.delenv("CUVIL_EDGED_DEBUG_FAULT_HOOKS", raising=False)
    (tmp_path / "gate.pause").touch()
    t0 = time.monotonic()
    pause("gate")
    assert time.monotonic() - t0 < 0.5 and not (tmp_path / "gate.reached").exists()
    assert not fault_hooks_enabled()


def test_pause_waits_while_the_flag_exists(monkeypatch, tmp_path):
    monkeypatch.setenv(PAUSE_ENV, str(tmp_path))
    flag = tmp_path / "gate.pause"
    flag.touch()
    threading.Timer(0.3, flag.unlink).start()
    t0 = time.monotonic()
    pause("gate")
    assert time.monotonic() - t0 >= 0.25
    assert (tmp_path / "gate.reached").read_text().isdigit()
