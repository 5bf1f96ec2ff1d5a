"""Test hooks that ship in the package, in one place, each off unless its environment variable is set.

Tests and the HIL rig need to stop the product at a chosen instant (a power cut between the switch
and the confirm) or make it misbehave on purpose (a hung event loop for systemd's watchdog). The
hooks live here, not in the modules they stop, so a reader of ``deploy/activate.py`` or
``daemon/server.py`` sees one named call, and a test (``tests/core/test_test_hooks.py``) proves the
shipped unit and the install path never enable any of them.

=================================== =====================================================
``CUVIL_EDGE_TEST_PAUSE_DIR=DIR``   the device-side deploy step waits at step ``S`` while
                                    ``DIR/S.pause`` exists, after creating ``DIR/S.reached``
                                    (steps: extract, before-switch, after-switch, gate,
                                    outcome, prune; docs/deploy.md)
``CUVIL_EDGED_DEBUG_FAULT_HOOKS=1`` SIGUSR2 stalls the daemon's event loop for good (the
                                    HIL rig's watchdog test)
=================================== =====================================================
"""

from __future__ import annotations

import logging
import os
import time

__all__ = ["FAULT_HOOKS_ENV", "HOOK_ENVS", "PAUSE_ENV", "fault_hooks_enabled", "pause", "stall_forever"]

PAUSE_ENV = "CUVIL_EDGE_TEST_PAUSE_DIR"
FAULT_HOOKS_ENV = "CUVIL_EDGED_DEBUG_FAULT_HOOKS"
HOOK_ENVS = (PAUSE_ENV, FAULT_HOOKS_ENV)


def pause(step: str) -> None:
    """Wait at ``step`` while ``$CUVIL_EDGE_TEST_PAUSE_DIR/<step>.pause`` exists (at most 300 s).

    A no-op unless the variable is set and the flag file exists.
    """
    directory = os.environ.get(PAUSE_ENV)
    if not directory:
        return
    flag = os.path.join(directory, f"{step}.pause")
    if not os.path.exists(flag):
        return
    with open(os.path.join(directory, f"{step}.reached"), "w") as f:
        f.write(str(os.getpid()))
    end = time.monotonic() + 300
    while os.path.exists(flag) and time.monotonic() < end:
        time.sleep(0.05)


def fault_hooks_enabled() -> bool:
    """Whether the daemon's fault hooks are on (``CUVIL_EDGED_DEBUG_FAULT_HOOKS=1``)."""
    return os.environ.get(FAULT_HOOKS_ENV) == "1"


def stall_forever(log: logging.Logger) -> None:
    """Block the calling thread for good, as a deadlocked handler would (never returns)."""
    log.error("debug fault hook: SIGUSR2 received, stalling the event loop")
    while True:
        time.sleep(3600)
