"""``cuvil-edged``: the on-device daemon's command line.

Thin, as uvicorn's ``main()``: options (each also ``CUVIL_EDGED_<NAME>``) become a
:class:`~cuvil_edge.daemon.config.Config`, which :class:`~cuvil_edge.daemon.server.Server` runs.
Exit codes: 0 after SIGTERM/SIGINT, 2 for bad usage, 3 when startup fails (bad store, port in use,
unknown board or telemetry spec, a model failing with ``--strict``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from cuvil_edge.errors import CuvilEdgeError

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the daemon; returns the exit code (also used as the console script's)."""
    from cuvil_edge.daemon.config import load
    from cuvil_edge.daemon.server import STARTUP_FAILURE, Server

    try:
        config = load(argv)
    except CuvilEdgeError as exc:
        print(f"cuvil-edged: error: {exc}", file=sys.stderr)
        return STARTUP_FAILURE
    logging.basicConfig(
        level=getattr(logging, config.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a == "--token" or a.startswith("--token=") for a in args):
        logging.getLogger("cuvil_edge.daemon").warning(
            "--token on the command line is readable by every user in /proc/<pid>/cmdline; "
            "use --token-file or CUVIL_EDGED_TOKEN")
    try:
        return Server(config).run()
    except CuvilEdgeError as exc:
        logging.getLogger("cuvil_edge.daemon").error("startup failed: %s", exc)
        return STARTUP_FAILURE


if __name__ == "__main__":
    sys.exit(main())
