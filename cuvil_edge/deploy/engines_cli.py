"""Terminal side of ``cuvil-edge engine build --on`` and ``cuvil-edge deploy --build-engines``.

Builder log lines scroll above a live line per device (spinner, last line, elapsed time): an
Orin's TensorRT build takes minutes, and a silent terminal for that long reads as a hang. Ctrl-C
cancels the rollout; :mod:`cuvil_edge.deploy.engines` then kills the device build's process group.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import time
from pathlib import Path
from typing import Any

from cuvil_edge._device_options import DeviceSelection

__all__ = ["build_on_devices", "run_engine_builds"]


def run_engine_builds(source: Any, devices: list[Any], *, as_json: bool = False, **kwargs: Any) -> list[Any]:
    """Run :func:`~cuvil_edge.deploy.engines.ensure_engines` with live progress; returns the outcomes."""
    from rich.markup import escape
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from cuvil_edge._console import console, err_console
    from cuvil_edge.deploy.engines import ensure_engine
    from cuvil_edge.deploy.transport import run_sync

    shown = err_console if as_json else console
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=shown,
                  transient=False) as bar:
        tasks = {d.label: bar.add_task(f"{d.label}: waiting", total=None) for d in devices}

        def on_line(device: str, line: str) -> None:
            bar.console.print(f"[dim]{escape(device)}[/] {escape(line)}", highlight=False, soft_wrap=True)
            bar.update(tasks[device], description=f"{device}: building - {line[:70]}")

        async def go() -> list[Any]:
            # Devices in parallel (8 at a time); one lock per key: the first of a key builds, its
            # twins wait for the cache and upload.
            sem = asyncio.Semaphore(8)
            locks: dict[Any, asyncio.Lock] = {}

            async def one(d: Any) -> Any:
                async with sem:
                    bar.update(tasks[d.label], description=f"{d.label}: probing")
                    res = await ensure_engine(d, source, on_line=on_line, key_locks=locks, **kwargs)
                    bar.update(tasks[d.label], description=f"{d.label}: {res.status}"
                               + (f" ({res.reason})" if res.reason else ""), total=1, completed=1)
                    return res

            return list(await asyncio.gather(*(one(d) for d in devices)))

        return run_sync(go())


def print_outcomes(outcomes: list[Any], title: str) -> None:
    from rich.table import Table

    from cuvil_edge._console import console

    t = Table(title=title)
    for col in ("device", "status", "engine key", "builder", "builds", "sent", "received", "s", "reason"):
        t.add_column(col, overflow="fold")
    colors = {"built": "green", "uploaded": "green", "present": "green", "cancelled": "yellow"}
    for r in outcomes:
        t.add_row(r.device, f"[{colors.get(r.status, 'red')}]{r.status}[/]", r.key or "-",
                  r.builder or "-", str(r.builds), str(r.bytes_sent), str(r.bytes_received), f"{r.seconds:.1f}",
                  r.reason or ("daemon reloaded" if r.reloaded else ""))
    console.print(t)


def build_on_devices(
    bundle: Path | None,
    devices: DeviceSelection,
    *,
    pub: Path | None,
    allow_unsigned: bool,
    device_cli: str,
    builder: str | None,
    dla_core: int | None,
    rebuild: bool,
    as_json: bool,
) -> None:
    """``cuvil-edge engine build --on DEVICE... BUNDLE``: see that command's help."""
    from cuvil_edge._console import console, err_console
    from cuvil_edge.deploy.engines import BundleEngineSource
    from cuvil_edge.deploy.fleet import select_devices
    from cuvil_edge.errors import DeployError

    t0 = time.monotonic()
    if bundle is None:
        raise DeployError("--on/--inventory need the bundle: cuvil-edge engine build --on DEVICE BUNDLE.cvb")
    if pub is None and not allow_unsigned:
        raise DeployError("pass --pub KEY to check the bundle's signature (or --allow-unsigned)")
    source = BundleEngineSource.from_bundle(Path(bundle), pub)
    outcomes = run_engine_builds(source, select_devices(devices), as_json=as_json, device_cli=shlex.split(device_cli),
                                 builder=builder, dla_core=dla_core, rebuild=rebuild)
    if as_json:
        print(json.dumps([o.to_dict() for o in outcomes], indent=2))
    else:
        print_outcomes(outcomes, f"engines for {source.name} {source.version}")
    ok = all(o.ok for o in outcomes)
    builds = sum(o.builds for o in outcomes)
    (err_console if as_json else console).print(
        f"[bold {'green' if ok else 'red'}]{'PASSED' if ok else 'FAILED'}[/] {len(outcomes)} device(s), "
        f"{builds} build(s) in {time.monotonic() - t0:.1f} s", highlight=False)
    if not ok:
        bad = [o for o in outcomes if not o.ok]
        raise DeployError(f"{len(bad)} of {len(outcomes)} device(s) have no engine: {bad[0].reason}")
