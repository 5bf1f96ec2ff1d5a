"""``cuvil-edge deploy | rollback | status | install-daemon``: thin wrappers over ``cuvil_edge.deploy``."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import typer

from cuvil_edge._console import print_table
from cuvil_edge._device_options import DeviceSelection, device_options

__all__ = ["register"]

OUTCOME_STATUSES = ("deployed", "unchanged", "rolled-back", "refused", "unreachable", "failed", "skipped")


def _opt(default: Any, *flags: str, help: str, **kw: Any) -> Any:  # noqa: A002
    """An option; the environment variables it reads come from the one rule in ``cuvil_edge/cli.py``."""
    return typer.Option(default, *flags, help=help, **kw)


DAEMON_TOKEN = _opt(None, "--daemon-token", help="Bearer token of the daemon.")
CONNECT_TIMEOUT = _opt(15.0, "--connect-timeout", help="SSH connect timeout, seconds.")
HEALTH_TIMEOUT = _opt(60.0, "--health-timeout", help="Seconds the health gate may take.")
CONFIRM_DEADLINE = _opt(120.0, "--confirm-deadline", help="Seconds a switch may stay unconfirmed on the device; "
                        "past it the device reverts it by itself (even after a lost link or a reboot).")
AS_JSON = _opt(False, "--json", help="Print JSON instead of tables.")


def _console(stderr: bool = False) -> Any:
    from cuvil_edge._console import console, err_console

    return err_console if stderr else console


@device_options()
def deploy_cmd(
    bundle: Path = typer.Argument(..., help="The bundle (.cvb) to deploy."),
    devices: DeviceSelection = DeviceSelection(),
    pub: Path = _opt(None, "--pub", help="Public key the bundle's signature must verify with."),
    allow_unsigned: bool = _opt(False, "--allow-unsigned",
                                help="Deploy without checking who signed the bundle (checksums still checked)."),
    daemon_token: str = DAEMON_TOKEN,
    keep: int = _opt(3, "--keep", help="Versions kept per device (current and previous always stay)."),
    health_timeout: float = HEALTH_TIMEOUT,
    confirm_deadline: float = CONFIRM_DEADLINE,
    connect_timeout: float = CONNECT_TIMEOUT,
    concurrency: int = _opt(8, "--concurrency", help="Devices deployed at once."),
    canary: int = _opt(1, "--canary", help="Devices that must succeed one by one before the rest."),
    batch_size: int = _opt(None, "--batch-size", help="Devices per batch after the canary. "
                           "Defaults to --concurrency."),
    max_fail_share: float = _opt(0.25, "--max-fail-share", help="Stop after a batch in which more than "
                                 "this share of devices failed."),
    report: Path = _opt(None, "--report", help="Write the JSON report here."),
    build_engines: bool = _opt(False, "--build-engines", help="Then give each device the bundle's TensorRT engine "
                               "for its key: built on the first device of a key, uploaded from the host cache to "
                               "the others (see cuvil-edge engine build --on)."),
    device_cli: str = _opt("cuvil-edge", "--device-cli", help="How to run cuvil-edge on the device (engine builds)."),
    engine_builder: str = _opt(None, "--engine-builder", help="Device builder: tensorrt (default) or standin "
                               "(the STAND-IN for tests without TensorRT)."),
    as_json: bool = AS_JSON,
) -> None:
    """Deploy a bundle to devices over SSH: verify, send, then the device switches, health-gates and
    confirms or switches back by itself.

    Devices come from --to and --inventory. A canary goes first, then batches; a batch with too
    many failures stops the rollout. Uploads resume; re-running finishes only what is left and
    reports outcomes that a lost link hid. A switch not confirmed within --confirm-deadline is
    reverted by the device.
    """
    from rich.markup import escape
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    from cuvil_edge.deploy.device import DeployOptions, prepare_bundle
    from cuvil_edge.deploy.fleet import RolloutPolicy, rollout, select_devices
    from cuvil_edge.deploy.transport import run_sync
    from cuvil_edge.errors import DeployError

    t0 = time.monotonic()
    if pub is None and not allow_unsigned:
        raise DeployError("pass --pub KEY to check the bundle's signature (or --allow-unsigned)")
    addresses = select_devices(devices)
    prepared = prepare_bundle(bundle, pub)
    options = DeployOptions(keep=keep, health_timeout=health_timeout, daemon_token=daemon_token,
                            connect_timeout=connect_timeout, confirm_deadline=confirm_deadline)
    options.check()
    policy = RolloutPolicy(concurrency=concurrency, canary=canary, batch_size=batch_size,
                           max_fail_share=max_fail_share)
    policy.check()
    console = _console()
    # One line per device per state change above one overall bar (gone at the end); the table
    # follows. --json prints the report only.
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeElapsedColumn(),
                  console=console if not as_json else None, disable=as_json, transient=True) as bar:
        overall = bar.add_task(f"{prepared.name} {prepared.version} → {len(addresses)} device(s)",
                               total=len(addresses) * prepared.size)
        shown: dict[str, int] = {}
        last_stage: dict[str, str] = {}

        def say(device: str, text: str) -> None:
            if not as_json:
                bar.console.print(f"{escape(device)}: {text}", highlight=False)

        def progress(device: str, stage: str, done: int, total: int) -> None:
            if stage in ("upload", "extract", "activate"):
                step = max(0, done - shown.get(device, 0))
                shown[device] = max(shown.get(device, 0), done)
                bar.advance(overall, step)
            if stage in OUTCOME_STATUSES or last_stage.get(device) == stage:
                return  # the final line comes from on_result
            last_stage[device] = stage
            detail = {"upload": f" {_size(total)}" + (f" from {_size(done)}" if done else ""),
                      "activate": f" (switch, gate, confirm on the device; deadline {confirm_deadline:g} s)"}
            say(device, f"{escape(stage)}{detail.get(stage, '')}")

        def on_result(r: Any) -> None:
            left = prepared.size - shown.get(r.device, 0)
            bar.advance(overall, max(0, left))  # the overall bar counts devices finished, whatever the end
            shown[r.device] = prepared.size
            color = "green" if r.ok else ("yellow" if r.status in ("rolled-back", "skipped") else "red")
            text = f"[{color}]{r.status}[/] {escape(r.version or '')}"
            if r.ok and r.previous:
                text += f" (previous {escape(r.previous)})"
            if r.reason and not r.ok:
                text += f": {escape(r.reason)}"
            say(r.device, f"{text} in {r.seconds:.1f} s")

        result = run_sync(rollout(prepared, addresses, options, policy, progress, on_result))
    if report is not None:
        result.write(report)
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        _print_results(result)
    ok = result.ok
    if build_engines:
        ok = _deploy_engines(bundle, pub, addresses, result, device_cli, engine_builder, daemon_token, as_json) and ok
    line = "PASSED" if ok else "FAILED"
    counts = ", ".join(f"{v} {k}" for k, v in sorted(result.counts().items()))
    _console(as_json).print(f"[bold {'green' if ok else 'red'}]{line}[/] {counts} in {time.monotonic() - t0:.1f} s",
                     highlight=False)
    if not ok:
        bad = sum(1 for r in result.results if not r.ok)
        raise DeployError(f"{bad} of {len(result.results)} device(s) do not serve {prepared.name} "
                          f"{prepared.version}; see the table{' and ' + str(report) if report else ''}")


def _deploy_engines(bundle: Path, pub: Path | None, devices: list[Any], result: Any, device_cli: str,
                    builder: str | None, daemon_token: str | None, as_json: bool) -> bool:
    """``--build-engines``: engines for the devices that now serve the bundle; True when all got one."""
    import shlex

    from cuvil_edge.deploy.engines import BundleEngineSource
    from cuvil_edge.deploy.engines_cli import print_outcomes, run_engine_builds

    served = {r.device for r in result.results if r.ok}
    targets = [d for d in devices if d.label in served]
    if not targets:
        return False
    source = BundleEngineSource.from_bundle(bundle, pub)
    outcomes = run_engine_builds(source, targets, as_json=as_json, device_cli=shlex.split(device_cli),
                                 builder=builder, daemon_token=daemon_token)
    if not as_json:
        print_outcomes(outcomes, f"engines for {source.name} {source.version}")
    return all(o.ok for o in outcomes)


def _print_results(report: Any) -> None:
    from rich.table import Table

    t = Table(title=f"deploy {report.bundle['name']} {report.bundle['version']}")
    for col in ("device", "status", "version", "previous", "serving", "sent", "s", "reason / notes"):
        t.add_column(col, overflow="fold")
    colors = {"deployed": "green", "unchanged": "green", "rolled-back": "yellow", "skipped": "dim"}
    for r in report.results:
        text = r.reason or "; ".join(r.notes)
        t.add_row(r.device, f"[{colors.get(r.status, 'red')}]{r.status}[/]", r.version or "-",
                  r.previous or "-", r.serving or "-", _size(r.bytes_sent), f"{r.seconds:.1f}", text)
    print_table(t, _console())
    if report.stopped:
        _console().print(f"[bold red]rollout stopped:[/] {report.stopped}", highlight=False)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _on_each(devices: list[Any], call: Callable[[Any], Awaitable[Any]], limit: int = 8) -> list[Any]:
    """``call`` on every device, ``limit`` at a time; results in device order."""
    import asyncio

    from cuvil_edge.deploy.transport import run_sync

    async def run() -> list[Any]:
        sem = asyncio.Semaphore(limit)

        async def one(device: Any) -> Any:
            async with sem:
                return await call(device)

        return list(await asyncio.gather(*(one(d) for d in devices)))

    return run_sync(run())


@device_options()
def rollback_cmd(
    name: str = typer.Argument(..., help="Bundle (model) name."),
    devices: DeviceSelection = DeviceSelection(),
    version: str = _opt(None, "--version", help="Version to go back to. Defaults to the previous one."),
    daemon_token: str = DAEMON_TOKEN,
    health_timeout: float = HEALTH_TIMEOUT,
    confirm_deadline: float = CONFIRM_DEADLINE,
    connect_timeout: float = CONNECT_TIMEOUT,
    as_json: bool = AS_JSON,
) -> None:
    """Switch a model back to its previous version (or --version) on each device, health-gated.

    The switch runs on the device as a deploy's does: confirmed by the gate, or switched back.
    """
    from cuvil_edge.deploy.device import DeployOptions, rollback_device
    from cuvil_edge.deploy.fleet import select_devices

    t0 = time.monotonic()
    addresses = select_devices(devices)
    options = DeployOptions(health_timeout=health_timeout, daemon_token=daemon_token,
                            connect_timeout=connect_timeout, confirm_deadline=confirm_deadline)
    options.check()
    results = _on_each(addresses, lambda d: rollback_device(d, name, version, options))
    if as_json:
        print(json.dumps([r.to_dict() for r in results], indent=2))
    else:
        from rich.table import Table

        t = Table(title=f"rollback {name}")
        for col in ("device", "status", "now", "was", "reason / notes"):
            t.add_column(col, overflow="fold")
        for r in results:
            st = "rolled back" if r.status == "deployed" else r.status
            t.add_row(r.device, st, r.version or "-", r.previous or "-", r.reason or "; ".join(r.notes))
        print_table(t, _console())
    ok = all(r.status == "deployed" for r in results)
    _console(as_json).print(f"[bold {'green' if ok else 'red'}]{'PASSED' if ok else 'FAILED'}[/] "
                     f"{len(results)} device(s) in {time.monotonic() - t0:.1f} s", highlight=False)
    _fail_unless(ok, f"rollback of {name} failed on some devices; see the table")


@device_options(leave_out=("device_python",))
def status_cmd(
    devices: DeviceSelection = DeviceSelection(),
    name: str = _opt(None, "--name", help="Only this bundle (model) name."),
    daemon_token: str = DAEMON_TOKEN,
    connect_timeout: float = CONNECT_TIMEOUT,
    as_json: bool = AS_JSON,
) -> None:
    """Per device: versions present, current and previous, pending switches with their deadline,
    the last deploy outcome, daemon and model health, board facts."""
    from cuvil_edge.deploy.device import DeployOptions, device_status
    from cuvil_edge.deploy.fleet import select_devices

    addresses = select_devices(devices)
    options = DeployOptions(daemon_token=daemon_token, connect_timeout=connect_timeout)
    results = _on_each(addresses, lambda d: device_status(d, name, options))
    if as_json:
        print(json.dumps(results, indent=2))
    else:
        from rich.table import Table

        t = Table(title="cuvil-edge devices")
        for col in ("device", "board", "daemon", "model", "current", "previous", "versions", "ready", "backend",
                    "pending switch", "last outcome"):
            t.add_column(col, overflow="fold")
        for s in results:
            if not s.get("reachable"):
                t.add_row(s["device"], "-", f"[red]unreachable[/]: {s.get('error', '')}", "", "", "", "", "", "", "",
                          "")
                continue
            f = s.get("facts") or {}
            board = f"{f.get('profile') or f.get('arch')}" + (f" L4T {f['l4t']}" if f.get("l4t") else "")
            models = s.get("models") or [{}]
            for i, m in enumerate(models):
                ready = {True: "[green]yes[/]", False: "[red]no[/]", None: "-"}[m.get("ready")]
                p = m.get("pending")
                pending = (f"[yellow]{p.get('version')}[/] (from {p.get('previous') or 'none'}) reverts at "
                           f"{p.get('deadline_at')} unless confirmed") if p else "-"
                o = m.get("last_outcome")
                last = f"{o.get('status')} {o.get('version')} at {o.get('at')}" if o else "-"
                t.add_row(s["device"] if i == 0 else "", board if i == 0 else "", s.get("daemon", "") if i == 0
                          else "", m.get("name", "-"), m.get("current") or "-", m.get("previous") or "-",
                          ", ".join(m.get("versions", [])) or "-", ready, _backend_text(m), pending, last)
        print_table(t, _console())
    _fail_unless(all(s.get("reachable") for s in results), "some devices are unreachable")


def _backend_text(model: dict[str, Any]) -> str:
    """``tensorrt (l4t-..._trt-..._sm8.7_dlanone)``, or ``onnxruntime`` and why."""
    backend = model.get("backend")
    if not backend:
        return "-"
    if model.get("engine_key") and backend != "onnxruntime":
        return f"{backend} ({model['engine_key']})"
    return f"{backend}: {model.get('engine_reason')}" if model.get("engine_reason") else str(backend)


@device_options(leave_out=("store", "daemon_port", "device_python"))
def install_daemon_cmd(
    devices: DeviceSelection = DeviceSelection(),
    unit: Path = _opt(None, "--unit", help="Unit file to install. Defaults to the packaged cuvil-edged.service."),
    start: bool = _opt(True, "--start/--no-start", help="Restart the service where systemd runs."),
    wheels: Path = _opt(None, "--wheels", help="Folder of wheels prepared for the board's Python and arch "
                        "(cuvil_edge-*.whl and its dependencies): installed offline into --venv, and the unit runs "
                        "that venv's cuvil-edged."),
    venv: str = _opt("/opt/cuvil-edge/venv", "--venv", help="The board's virtual environment (made with "
                     "--system-site-packages, where JetPack's TensorRT is)."),
    no_deps: bool = _opt(False, "--no-deps", help="With --wheels: install only the wheels' own packages."),
    connect_timeout: float = CONNECT_TIMEOUT,
    as_json: bool = AS_JSON,
) -> None:
    """Install the daemon's systemd unit on each device and enable it (daemon-reload where systemd runs).

    As root or as a login user with sudo (a sudo that asks for a password is one clear error). With
    --wheels the project is installed first, offline, into a venv that sees the system's TensorRT.
    """
    from cuvil_edge.deploy.fleet import select_devices
    from cuvil_edge.deploy.install import install_daemon, read_unit

    t0 = time.monotonic()
    addresses = select_devices(devices)
    data = read_unit(unit)
    results = _on_each(addresses, lambda d: install_daemon(d, data, start, connect_timeout, wheels, venv, no_deps),
                       limit=max(1, len(addresses)))
    if as_json:
        print(json.dumps([r.to_dict() for r in results], indent=2))
    else:
        from rich.table import Table

        t = Table(title="install-daemon")
        for col in ("device", "status", "unit", "runs", "enabled for", "systemd", "TensorRT", "reason"):
            t.add_column(col, overflow="fold")
        for r in results:
            t.add_row(r.device + (" (sudo)" if r.sudo else ""), r.status, r.unit_path, r.exec_start,
                      ", ".join(r.enabled), "running" if r.systemd_running else "not running (enabled for next boot)",
                      r.tensorrt or "-", r.reason)
        print_table(t, _console())
    ok = all(r.ok for r in results)
    _console(as_json).print(f"[bold {'green' if ok else 'red'}]{'PASSED' if ok else 'FAILED'}[/] "
                     f"{len(results)} device(s) in {time.monotonic() - t0:.1f} s", highlight=False)
    _fail_unless(ok, "the unit could not be installed on some devices; see the table")


def _fail_unless(ok: bool, message: str) -> None:
    # A CuvilEdgeError, not typer.Exit: cuvil_edge.cli.main turns it into exit 1 with one line.
    from cuvil_edge.errors import DeployError

    if not ok:
        raise DeployError(message)


def register(app: typer.Typer) -> None:
    """Add ``deploy``, ``rollback``, ``status`` and ``install-daemon`` to the CLI."""
    app.command("deploy")(deploy_cmd)
    app.command("rollback")(rollback_cmd)
    app.command("status")(status_cmd)
    app.command("install-daemon")(install_daemon_cmd)
