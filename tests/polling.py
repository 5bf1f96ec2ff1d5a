"""Waiting for a process under test without fixed sleeps: poll a condition until a deadline.

A fixed ``time.sleep`` is either too short on a loaded CI machine (a flaky test) or too long on a quiet
one (a slow test). :func:`wait_until` returns as soon as the condition holds and fails with the last
value it saw when the deadline passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["wait_until"]

T = TypeVar("T")


def wait_until(probe: Callable[[], T], what: str, timeout: float = 30.0, interval: float = 0.05) -> T:
    """Calls ``probe`` until it returns a truthy value, and returns that value.

    Args:
        probe (Callable[[], T]): the condition; its truthy result is returned.
        what (str): what is awaited, for the failure message ("three watchdog pings").
        timeout (float): seconds before the test fails. Defaults to 30.
        interval (float): seconds between probes. Defaults to 0.05.

    Raises:
        AssertionError: the deadline passed; the message names ``what`` and the last value seen.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {value!r})")
        time.sleep(interval)
