"""``hil/run``: run the on-device suite on a HIL target and write the JSON report.

Exit status: 0 when every check passed (skips allowed) and the daemon's journal holds no ERROR
line a check did not declare, 1 when a check failed (or the run fell back from an unreachable
board without ``--allow-fallback``), 3 when the run could not start (unknown target, unreachable
board without fallback, image build or boot failed). A failed run keeps its folder (console,
journal, report, overlay) and says where; ``--clean`` deletes it anyway.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from hil.errors import HilError

__all__ = ["main"]

STARTUP_FAILURE = 3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hil/run", description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="a target of hil/targets.toml (or $CUVIL_HIL_TARGETS)")
    parser.add_argument("--suite", default="smoke", choices=("smoke", "full", "powercut", "boot"),
                        help="smoke (CI), full (everything), powercut (power cuts during deploys) or boot")
    parser.add_argument("--report", type=Path, help="write the JSON report here")
    parser.add_argument("--keep", action="store_true", help="leave an emulated board running afterwards")
    parser.add_argument("--targets-file", type=Path, help="another targets file")
    parser.add_argument("--clean", action="store_true", help="delete the run's folder even when the run failed")
    parser.add_argument("--allow-fallback", action="store_true",
                        help="a run on the fallback of an unreachable board may pass (it fails otherwise)")
    args = parser.parse_args(argv)

    from rich.console import Console

    from hil.runner import run_suite

    con = Console(stderr=True)
    t0 = time.monotonic()

    def terminated(signum: int, frame: object) -> None:
        # `timeout` and CI cancel with SIGTERM: unwind like an error, so the board is powered off
        # and the report (with what ran so far) is written, instead of dying where we stand.
        raise HilError(f"terminated by signal {signum} after {time.monotonic() - t0:.0f} s")

    signal.signal(signal.SIGTERM, terminated)
    try:
        report = run_suite(args.target, args.suite, args.report, keep=args.keep, targets_path=args.targets_file,
                           console=con, clean=args.clean, allow_fallback=args.allow_fallback)
    except HilError as exc:
        con.print(f"[bold red]hil/run: {exc}[/]", highlight=False)
        con.print(f"[bold red]FAILED[/] (could not run) in {time.monotonic() - t0:.1f} s")
        return STARTUP_FAILURE
    summary = (f"{report['passed']} passed, {report['failed']} failed, {report['skipped']} skipped on "
               f"{report['ran_on']}" + (f" (fallback from {report['target']})" if report.get("fallback") else "")
               + f", arch {report.get('arch')}, systemd {report.get('systemd', '-')}, kernels "
               f"{(report.get('daemon_kernels_isa') or report.get('kernels_isa') or {}).get('resize_normalize', '-')}")
    if report.get("fallback_refused"):
        con.print(f"[bold red]{report['fallback_refused']}[/]", highlight=False)
    verdict = "[bold green]PASSED[/]" if report["ok"] else "[bold red]FAILED[/]"
    con.print(f"{verdict} {summary} in {time.monotonic() - t0:.1f} s"
              + (f"; report {args.report}" if args.report else ""), highlight=False)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
