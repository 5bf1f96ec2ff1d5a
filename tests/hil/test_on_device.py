"""The on-device suite through pytest: ``pytest tests/hil --hil-target qemu-system``.

Same checks, same order as ``hil/run`` (``hil/suite.py``); a failed prerequisite (boot,
install, daemon ready, first deploy) skips the checks after it instead of failing them in cascade.
"""

from __future__ import annotations

from typing import Any

import pytest

from hil.runner import PREREQUISITES
from hil.suite import CHECKS, CheckSkipped

pytestmark = [pytest.mark.hil, pytest.mark.slow, pytest.mark.serial]


@pytest.mark.parametrize("check", CHECKS, ids=[c.name for c in CHECKS])
def test_on_device(check: Any, hil_ctx: Any, request: pytest.FixtureRequest) -> None:
    if request.config.getoption("--hil-suite") == "smoke" and not check.smoke:
        pytest.skip("not in the smoke suite")
    blocked = hil_ctx.info.get("failed_prerequisite")
    if blocked:
        pytest.skip(f"prerequisite {blocked} failed")
    try:
        check.fn(hil_ctx)
    except CheckSkipped as exc:
        pytest.skip(str(exc))
    except BaseException:
        if check.name in PREREQUISITES:
            hil_ctx.info["failed_prerequisite"] = check.name
        raise
