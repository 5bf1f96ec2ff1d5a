"""Run a suite on a target and write the JSON report: the one engine behind ``hil/run`` and pytest.

Target resolution: an ``ssh`` target that does not answer falls back to its ``fallback``
(a ``qemu-system`` target) and the report says so (``"fallback"``); ``qemu-system`` boots the
emulated board; ``qemu-user`` runs the kernels' self-test on each CPU model of its matrix;
``local`` reports this machine's kernels.

Report (JSON)::

    {"target": "...", "ran_on": "...", "kind": "...", "suite": "smoke", "fallback": null | {...},
     "arch": "aarch64", "kernel": "6.1.0-...-arm64", "systemd": "252", "kernels_isa": {...},
     "daemon_kernels_isa": {...}, "kernels": "neon", "boot_seconds": 31.2, "image": {"hash": ..., "build_seconds": ...},
     "tests": [{"name": ..., "outcome": "passed|failed|skipped", "seconds": ..., "details"|"error": ...}],
     "passed": n, "failed": n, "skipped": n, "seconds": ..., "ok": true}
"""

from __future__ import annotations

import json
import platform
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.markup import escape

from hil.board import Board, boot, connect, reachable
from hil.errors import HilError
from hil.suite import CheckSkipped, SuiteContext, checks_for
from hil.targets import HilTarget, load_hil_targets

__all__ = ["board_for", "resolve_target", "run_suite", "write_report"]

# Checks the rest build on: when one fails, the later ones are skipped, not failed in cascade.
PREREQUISITES = ("boot", "install_project", "install_daemon_ready", "deploy_fresh")


def resolve_target(name: str, targets_path: Path | None = None,
                   say: Callable[[str], None] | None = None) -> tuple[HilTarget, dict[str, Any] | None]:
    """The target to run on, and the fallback record when an ``ssh`` board did not answer.

    Raises:
        TargetError: unknown name.
        HilError: an unreachable ``ssh`` target without a ``fallback``.
    """
    targets = load_hil_targets(targets_path)
    if name not in targets:
        from hil.errors import TargetError

        raise TargetError(f"unknown HIL target '{name}'; known: {', '.join(sorted(targets))}")
    t = targets[name]
    if t.kind != "ssh" or reachable(t.host, t.port, t.connect_timeout):
        return t, None
    reason = f"no SSH server answers at {t.host}:{t.port} within {t.connect_timeout:.0f} s"
    if not t.fallback:
        raise HilError(f"target '{name}': {reason}, and it names no fallback")
    fb = {"from": name, "to": t.fallback, "reason": reason}
    if say is not None:
        say(f"[bold yellow]target {name} unreachable[/] ({reason}): falling back to [bold]{t.fallback}[/]")
    return targets[t.fallback], fb


@contextmanager
def board_for(target: HilTarget, keep: bool = False, console: Any = None) -> Iterator[Board]:
    """A board for a ``qemu-system`` or ``ssh`` target, closed on exit."""
    if target.kind == "qemu-system":
        with boot(target, keep=keep, console=console) as b:
            yield b
    elif target.kind == "ssh":
        b = connect(target, console=console)
        try:
            yield b
        finally:
            b.close()
    else:
        raise HilError(f"target '{target.name}' ({target.kind}) has no board")


def _run_checks(ctx: SuiteContext, suite: str, say: Callable[[str], None]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    blocked = ""
    for check in checks_for(suite):
        t0 = time.monotonic()
        entry: dict[str, Any] = {"name": check.name}
        if blocked:
            entry.update(outcome="skipped", seconds=0.0, reason=f"prerequisite {blocked} failed")
        else:
            try:
                entry["details"] = check.fn(ctx)
                entry["outcome"] = "passed"
            except CheckSkipped as exc:
                entry.update(outcome="skipped", reason=str(exc))
            except Exception as exc:  # a failed check is reported, never fatal to the run
                entry.update(outcome="failed", error=f"{type(exc).__name__}: {exc}")
                if not isinstance(exc, HilError):
                    entry["traceback"] = traceback.format_exc()[-2000:]
                if check.name in PREREQUISITES:
                    blocked = check.name
            entry["seconds"] = round(time.monotonic() - t0, 2)
        colour = {"passed": "green", "failed": "red", "skipped": "yellow"}[entry["outcome"]]
        extra = entry.get("error") or entry.get("reason") or ""
        say(f"  [{colour}]{entry['outcome']:7}[/] {check.name:30} {entry['seconds']:7.1f} s  {escape(extra[:300])}")
        results.append(entry)
    return results


def _qemu_user_checks(target: HilTarget, say: Callable[[str], None]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from hil import qemu_user
    from hil.project import REPO

    build = subprocess.run([str(REPO / "cross" / "build.sh"), "aarch64"], capture_output=True, text=True, timeout=900)
    if build.returncode != 0:
        raise HilError(f"cross/build.sh aarch64 failed: {build.stderr.strip()[-600:]}")
    selftest = REPO / "build" / "aarch64" / "cuvil_sve_selftest"
    models = {m.name: m for m in qemu_user.CPU_MODELS}
    results = []
    isas: dict[str, str] = {}
    for name in target.cpus or tuple(models):
        t0 = time.monotonic()
        entry: dict[str, Any] = {"name": f"selftest[{name}]"}
        model = models.get(name)
        if model is None:
            entry.update(outcome="failed", error=f"unknown CPU model {name}; known: {', '.join(models)}")
        else:
            p = qemu_user.run([str(selftest), "1"], model.cpu)
            first = (p.stdout.splitlines() or [""])[0]
            isa = first.split("isa ", 1)[1].split(",")[0] if "isa " in first else "?"
            isas[name] = isa
            ok = p.returncode == 0 and isa == model.best_isa
            entry.update(outcome="passed" if ok else "failed", details={"isa": isa, "expected": model.best_isa,
                                                                        "summary": p.stdout.strip()[-200:]})
            if not ok:
                entry["error"] = f"exit {p.returncode}, isa {isa} (expected {model.best_isa}): {p.stderr[-300:]}"
        entry["seconds"] = round(time.monotonic() - t0, 2)
        say(f"  {entry['outcome']:7} {escape(entry['name']):30} {entry['seconds']:7.1f} s  isa {isas.get(name, '?')}")
        results.append(entry)
    return results, {"arch": "aarch64 (qemu-user)", "kernels_isa": isas}


def run_suite(target_name: str, suite: str = "smoke", report_path: Path | None = None, keep: bool = False,
              targets_path: Path | None = None, console: Any = None) -> dict[str, Any]:
    """Runs ``suite`` on ``target_name`` and returns (and writes) the report.

    Raises:
        HilError: the target is unknown or unreachable without fallback, the image cannot be
            built, or the board does not boot (the report, when asked for, is written first).
    """
    from rich.console import Console

    con = console if console is not None else Console(stderr=True)
    t0 = time.time()
    report: dict[str, Any] = {"target": target_name, "suite": suite, "started": time.strftime(
        "%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)), "fallback": None, "tests": []}
    try:
        target, fallback = resolve_target(target_name, targets_path, say=con.print)
        report.update(ran_on=target.name, kind=target.kind, fallback=fallback, board=target.board)
        con.print(f"[bold]HIL[/] target {target_name}" + (f" -> {target.name}" if fallback else "")
                  + f" ({target.kind}), suite {suite}")
        if target.kind in ("qemu-system", "ssh"):
            with tempfile.TemporaryDirectory(prefix="cuvil-hil-suite-") as tmp, \
                    board_for(target, keep=keep, console=con) as board:
                if board.image is not None:
                    build_s = board.image.dir / "build-seconds.txt"
                    report["image"] = {"hash": board.image.dir.name, "dir": str(board.image.dir),
                                       "build_seconds": float(build_s.read_text()) if build_s.is_file() else None}
                report["boot_seconds"] = board.boot_seconds
                ctx = SuiteContext(board=board, workdir=Path(tmp))
                report["tests"] = _run_checks(ctx, suite, con.print)
                report.update({k: v for k, v in ctx.info.items() if k not in report})
        elif target.kind == "qemu-user":
            report["tests"], facts = _qemu_user_checks(target, con.print)
            report.update(facts)
        else:
            from cuvil_edge import sve

            info = sve.cpu_info()
            report.update(arch=platform.machine(), kernel=platform.release(), kernels_isa=info["isa"])
            report["tests"] = [{"name": "kernels_isa", "outcome": "passed", "seconds": 0.0, "details": info}]
    except HilError as exc:
        report["error"] = str(exc)
        raise
    finally:
        isa = report.get("daemon_kernels_isa") or report.get("kernels_isa") or {}
        if isinstance(isa, dict) and isa.get("resize_normalize"):
            report["kernels"] = isa["resize_normalize"]  # the pre-processing ISA, in one word
        outcomes = [t["outcome"] for t in report["tests"]]
        report.update(passed=outcomes.count("passed"), failed=outcomes.count("failed"),
                      skipped=outcomes.count("skipped"), seconds=round(time.time() - t0, 1))
        report["ok"] = "error" not in report and report["failed"] == 0 and report["passed"] > 0
        if report_path is not None:
            write_report(report, report_path)
    return report


def write_report(report: dict[str, Any], path: Path) -> None:
    """Writes the report atomically (a temp file renamed into place)."""
    from cuvil_edge._atomic import atomic_write_text

    atomic_write_text(Path(path), json.dumps(report, indent=2, default=str) + "\n")
