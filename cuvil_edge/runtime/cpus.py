"""How many threads one inference should use: the physical cores this process may run on.

ONNX Runtime, left to pick its intra-op thread count, also pins each thread to a core with
``pthread_setaffinity_np``. Under the daemon's systemd unit that call is refused
(``SystemCallFilter=~@resources`` denies ``sched_setaffinity``), so every session printed
"pthread_setaffinity_np failed ... Operation not permitted" for each thread. A thread count set
explicitly turns the pinning off (ONNX Runtime's own advice in that message); this module gives
the count ONNX Runtime would have picked, the physical cores, counted among the CPUs the process
is allowed (a unit's ``CPUAffinity=`` or a container's cpuset), so no thread waits for a core it
may not use.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["usable_cores"]

SYSFS_CPU = "/sys/devices/system/cpu"


def usable_cores(sysfs: str | os.PathLike[str] = SYSFS_CPU) -> int:
    """Physical cores among the CPUs this process may run on (at least 1).

    Two logical CPUs of one core (SMT siblings, same ``topology/thread_siblings_list``) count
    once. Without the topology files each allowed CPU counts as a core.

    Args:
        sysfs (str | PathLike): the CPU directory of sysfs. Defaults to ``/sys/devices/system/cpu``.
    """
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)
    cores: set[str] = set()
    for cpu in allowed:
        try:
            siblings = (Path(sysfs) / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text().strip()
        except OSError:
            siblings = ""
        cores.add(siblings or f"cpu{cpu}")
    return max(1, len(cores))
