"""Fixtures of the HIL tests: ``--hil-target NAME`` selects the board; without it the on-device
checks skip (the normal suite never boots a VM; CI runs ``hil/run`` once instead)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--hil-target", default=None, help="run the on-device suite on this HIL target "
                     "(hil/targets.toml), e.g. qemu-system")
    parser.addoption("--hil-suite", default="full", choices=("smoke", "full"),
                     help="which checks the on-device tests run (default: full)")


def hil_target_option(config: pytest.Config) -> str | None:
    try:
        return config.getoption("--hil-target")
    except ValueError:  # conftest not loaded as an initial conftest: the option does not exist
        return None


@pytest.fixture(scope="session")
def hil_target(request: pytest.FixtureRequest) -> str:
    name = hil_target_option(request.config)
    if not name:
        pytest.skip("on-device check: pass --hil-target NAME (e.g. qemu-system) to run it on a board")
    return name


@pytest.fixture(scope="session")
def hil_ctx(hil_target: str) -> Iterator[Any]:
    """One board for the whole session, and the suite context the checks share."""
    from hil.runner import board_for, resolve_target
    from hil.suite import SuiteContext

    target, _fallback = resolve_target(hil_target)
    if target.kind not in ("qemu-system", "ssh"):
        pytest.skip(f"target {hil_target} ({target.kind}) has no board for the on-device checks")
    with tempfile.TemporaryDirectory(prefix="cuvil-hil-pytest-") as tmp, board_for(target, power_cuts=True) as board:
        ctx = SuiteContext(board=board, workdir=Path(tmp))
        ctx.info["failed_prerequisite"] = None
        yield ctx
