"""Run a suite on a target and write the JSON report: the one engine behind ``hil/run`` and pytest.

Target resolution: an ``ssh`` target that does not answer falls back to its ``fallback``
(a ``qemu-system`` target) and the report says so (``"fallback"``); ``qemu-system`` boots the
emulated board; ``qemu-user`` runs the kernels' self-test on each CPU model of its matrix;
``local`` reports this machine's kernels.

Evidence: an emulated or real board's run keeps its folder (``$CUVIL_HIL_RUNS``, default
``<tmp>/cuvil-hil-runs/<time>-<target>-<suite>/``) with the serial console (``console*.log``, one per
boot), the board's journal (``journal*.txt``, one per boot), the report and the QEMU overlay; it is
deleted when the run passed (or always with ``clean=True``), so a failed CI run keeps what it saw.
Every failed test in the report carries the journal and console excerpts of the moment it failed.

Every ERROR line of the daemon's unit in the journal (its own ``ERROR`` log lines, ONNX Runtime's
``[E:`` lines, anything at syslog priority err or worse) fails the run, unless a check that ran
declares it expected (``Check.expected_errors``): the report lists them under ``journal_errors``.

A fallback from an unreachable ``ssh`` board is run and reported (``"fallback"``), and fails the
run unless ``allow_fallback=True`` (``hil/run --allow-fallback``).

Report (JSON)::

    {"target": "...", "ran_on": "...", "kind": "...", "suite": "smoke", "fallback": null | {...},
     "arch": "aarch64", "kernel": "6.1.0-...-arm64", "systemd": "252", "kernels_isa": {...},
     "daemon_kernels_isa": {...}, "kernels": "neon", "boot_seconds": 31.2, "image": {"hash": ..., "build_seconds": ...},
     "tests": [{"name": ..., "outcome": "passed|failed|skipped", "seconds": ..., "details"|"error": ...,
                "journal_excerpt": "..." (failed), "console_excerpt": "..." (failed)}],
     "journal_errors": {"unexplained": [...], "expected": [...]}, "run_dir": "...",
     "passed": n, "failed": n, "skipped": n, "seconds": ..., "ok": true}
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shutil
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

__all__ = ["board_for", "resolve_target", "run_suite", "verdict", "write_report"]

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
def board_for(target: HilTarget, keep: bool = False, console: Any = None, workdir: Path | None = None,
              power_cuts: bool = False) -> Iterator[Board]:
    """A board for a ``qemu-system`` or ``ssh`` target, closed on exit."""
    if target.kind == "qemu-system":
        with boot(target, keep=keep, console=console, workdir=workdir, power_cuts=power_cuts) as b:
            yield b
    elif target.kind == "ssh":
        b = connect(target, console=console)
        try:
            yield b
        finally:
            b.close()
    else:
        raise HilError(f"target '{target.name}' ({target.kind}) has no board")


# The daemon's error lines: its logging's ERROR level, ONNX Runtime's native error lines.
_ERROR_LINE = re.compile(r"\bERROR\b|\[E:onnxruntime|\bTraceback \(most recent call last\)")
UNIT = "cuvil-edged.service"


def board_journal(board: Board, lines: int | None = None) -> str:
    """The board's journal of this boot (all of it, or its last ``lines``), as text; "" when unreachable."""
    argv = ["journalctl", "-b", "--no-pager", "-o", "short-iso"] + (["-n", str(lines)] if lines else [])
    try:
        return board.ssh(argv, check=False, timeout=120).stdout
    except HilError:
        return ""


def daemon_error_lines(board: Board) -> list[str]:
    """ERROR lines of the daemon's unit in this boot's journal (its processes, not systemd's lines about it)."""
    try:
        out = board.ssh(["journalctl", "-b", "--no-pager", "-o", "json", f"_SYSTEMD_UNIT={UNIT}"], check=False,
                        timeout=120).stdout
    except HilError:
        return []
    found = []
    for raw in out.splitlines():
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        msg = rec.get("MESSAGE")
        if isinstance(msg, list):  # journald's form for non-UTF-8 bytes
            msg = bytes(msg).decode("utf-8", "replace")
        msg = str(msg or "")
        prio = int(rec.get("PRIORITY", 6) or 6)
        if _ERROR_LINE.search(msg) or prio <= 3:
            found.append(msg[:500])
    return found


def judge_journal_errors(lines: list[str], expected: list[str]) -> dict[str, list[str]]:
    """Split error lines into those a check declared (a regex in ``expected``) and the rest."""
    pats = [re.compile(p) for p in expected]
    out: dict[str, list[str]] = {"unexplained": [], "expected": []}
    for line in lines:
        out["expected" if any(p.search(line) for p in pats) else "unexplained"].append(line)
    return out


def _evidence(ctx: SuiteContext, entry: dict[str, Any]) -> None:
    """Journal and console excerpts of a failed check, while the board is as it left it."""
    board = ctx.board
    with contextlib.suppress(Exception):
        entry["journal_excerpt"] = board_journal(board, 60)[-6000:] or "(board unreachable)"
    with contextlib.suppress(Exception):
        entry["console_excerpt"] = board.console_tail(30) if board.emulated else "(real board: no console)"


def _run_checks(ctx: SuiteContext, suite: str, say: Callable[[str], None],
                results: list[dict[str, Any]] | None = None,
                progress: Callable[[], None] | None = None) -> list[dict[str, Any]]:
    """Run the suite's checks in order into ``results``; ``progress`` after each (the partial report)."""
    results = [] if results is None else results
    blocked = ""
    for check in checks_for(suite):
        t0 = time.monotonic()
        entry: dict[str, Any] = {"name": check.name}
        if blocked:
            entry.update(outcome="skipped", seconds=0.0, reason=f"prerequisite {blocked} failed")
        else:
            ctx.expected_errors.extend(check.expected_errors)
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
                _evidence(ctx, entry)
            entry["seconds"] = round(time.monotonic() - t0, 2)
        colour = {"passed": "green", "failed": "red", "skipped": "yellow"}[entry["outcome"]]
        extra = entry.get("error") or entry.get("reason") or ""
        say(f"  [{colour}]{entry['outcome']:7}[/] {escape(check.name):30} {entry['seconds']:7.1f} s  {escape(extra[:300])}")
        results.append(entry)
        if progress is not None:
            progress()
    return results


def _journal_check(ctx: SuiteContext, say: Callable[[str], None]) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The run's last word: no unexplained ERROR line of the daemon in this boot's journal (earlier
    boots of a power-cut run were judged before each cut: ``ctx.journal_errors``)."""
    t0 = time.monotonic()
    if ctx.workdir_run is not None:
        (ctx.workdir_run / f"journal-boot{ctx.board.power_cuts}.txt").write_text(board_journal(ctx.board))
    lines = ctx.journal_errors + daemon_error_lines(ctx.board)
    judged = judge_journal_errors(lines, ctx.expected_errors)
    entry: dict[str, Any] = {"name": "journal_no_unexplained_errors", "seconds": 0.0}
    if judged["unexplained"]:
        entry.update(outcome="failed", error=f"{len(judged['unexplained'])} ERROR line(s) of {UNIT} no check "
                     f"expected: {judged['unexplained'][0][:300]}")
        _evidence(ctx, entry)
    else:
        entry.update(outcome="passed", details={"error_lines": len(lines), "expected": len(judged["expected"])})
    entry["seconds"] = round(time.monotonic() - t0, 2)
    colour = "green" if entry["outcome"] == "passed" else "red"
    say(f"  [{colour}]{entry['outcome']:7}[/] {entry['name']:30} {entry['seconds']:7.1f} s  "
        f"{escape(entry.get('error', '')[:300])}")
    return entry, judged


def _run_dir(target: str, suite: str) -> Path:
    base = Path(os.environ.get("CUVIL_HIL_RUNS") or Path(tempfile.gettempdir()) / "cuvil-hil-runs")
    path = base / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{target}-{suite}"
    path.mkdir(parents=True, exist_ok=True)
    return path


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
              targets_path: Path | None = None, console: Any = None, clean: bool = False,
              allow_fallback: bool = False) -> dict[str, Any]:
    """Runs ``suite`` on ``target_name`` and returns (and writes) the report.

    Args:
        clean (bool): delete the run's folder even when the run failed. Defaults to False.
        allow_fallback (bool): a run on the fallback of an unreachable ``ssh`` target may pass.
            Defaults to False (it runs, is reported, and fails the run).

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
            run_dir = _run_dir(target.name, suite)
            report["run_dir"] = str(run_dir)
            power_cuts = suite in ("powercut", "full")
            with board_for(target, keep=keep, console=con, workdir=run_dir, power_cuts=power_cuts) as board:
                if board.image is not None:
                    build_s = board.image.dir / "build-seconds.txt"
                    report["image"] = {"hash": board.image.dir.name, "dir": str(board.image.dir),
                                       "build_seconds": float(build_s.read_text()) if build_s.is_file() else None}
                report["boot_seconds"] = board.boot_seconds
                work = run_dir / "work"
                work.mkdir(exist_ok=True)
                ctx = SuiteContext(board=board, workdir=work, workdir_run=run_dir)

                def partial() -> None:  # a run cut short (timeout, SIGTERM) still leaves what it saw
                    write_report({**report, "partial": True}, run_dir / "report.json")

                _run_checks(ctx, suite, con.print, report["tests"], partial)
                if suite != "boot":
                    entry, report["journal_errors"] = _journal_check(ctx, con.print)
                    report["tests"].append(entry)
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
        report.update(verdict(report, allow_fallback))
        run_dir_s = report.get("run_dir")
        if run_dir_s:
            report["run_dir_kept"] = not ((report["ok"] or clean) and not keep)
        if report_path is not None:
            write_report(report, report_path)
        if run_dir_s:
            if report["run_dir_kept"]:
                write_report(report, Path(run_dir_s) / "report.json")
                con.print(f"evidence kept in {run_dir_s} (console, journal, report, overlay)", highlight=False)
            else:
                shutil.rmtree(run_dir_s, ignore_errors=True)
    return report


def verdict(report: dict[str, Any], allow_fallback: bool = False) -> dict[str, Any]:
    """``{"ok": ...}`` of a finished report, and ``fallback_refused`` when it ran on the fallback of
    an unreachable board without ``allow_fallback`` (a lab whose board is down must not pass)."""
    ok = "error" not in report and report.get("failed", 0) == 0 and report.get("passed", 0) > 0
    fb = report.get("fallback")
    if fb and not allow_fallback:
        return {"ok": False, "fallback_refused": f"ran on the fallback {fb['to']}, not on {fb['from']} "
                                                 f"({fb['reason']}); pass --allow-fallback to accept that"}
    return {"ok": ok}


def write_report(report: dict[str, Any], path: Path) -> None:
    """Writes the report atomically (a temp file renamed into place)."""
    from cuvil_edge._atomic import atomic_write_text

    atomic_write_text(Path(path), json.dumps(report, indent=2, default=str) + "\n")
