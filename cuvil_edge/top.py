"""``cuvil-edge top``: a live terminal view of a running ``cuvil-edged``.

It reads what the daemon already publishes, once a second: ``/metrics`` (Prometheus text: board
telemetry, memory budget and pressure, prefetch depth and why it last changed, per-model queue,
batch cap and latency percentiles) and ``/v2/models/stats`` (KServe statistics: counts, from
which it derives request rate and mean batch size between two refreshes). Nothing is computed on
the device for the view's sake, so watching a board costs it two small HTTP requests a second.

The daemon listens on its loopback; for a remote board ``--ssh user@host`` opens the same SSH port
forward ``cuvil-edge deploy`` uses (``Transport.forward_local``, :mod:`cuvil_edge.deploy.transport_base`)
for as long as the view runs. ``q`` or Ctrl-C ends it and restores the terminal.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The one Prometheus text parser (loadgen reads /metrics with it too); re-exported here, its old home.
from cuvil_edge._prometheus import Samples, parse_prometheus
from cuvil_edge.errors import CuvilEdgeError

__all__ = ["DaemonView", "TopError", "fetch_view", "parse_prometheus", "register", "render", "run_top"]

MiB = 1024 * 1024
LEVEL_NAMES = ("NORMAL", "SHRINK_PREFETCH", "CAP_BATCH", "RELEASE_IDLE", "UNLOAD_LRU", "REJECT")


class TopError(CuvilEdgeError):
    """The daemon cannot be read (unreachable, refused, or not a cuvil-edged)."""


def _one(samples: Samples, name: str, **match: str) -> float | None:
    for labels, value in samples.get(name, []):
        if all(labels.get(k) == v for k, v in match.items()):
            return value
    return None


def _labelled(samples: Samples, name: str, key: str, **match: str) -> dict[str, float]:
    return {labels.get(key, ""): value for labels, value in samples.get(name, [])
            if all(labels.get(k) == v for k, v in match.items())}


@dataclass
class ModelRow:
    """One model version as the view shows it."""

    name: str
    version: str
    queue: float | None = None
    batch_cap: float | None = None
    mean_batch: float | None = None
    requests_per_s: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    rejected: float | None = None
    admission: str = "open"
    depth: float | None = None
    need: float | None = None
    depth_reason: str = ""


@dataclass
class DaemonView:
    """Everything one refresh shows; rates need the previous view."""

    url: str
    at: float
    models: list[ModelRow] = field(default_factory=list)
    memory: dict[str, Any] = field(default_factory=dict)
    board: dict[str, Any] = field(default_factory=dict)
    counts: dict[str, tuple[float, float, float]] = field(default_factory=dict)  # success, inferences, batches


def _get(url: str, token: str | None, timeout: float) -> bytes:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - the user's daemon URL
            return resp.read(8 * MiB)
    except urllib.error.HTTPError as exc:
        raise TopError(f"{url}: HTTP {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise TopError(f"{url}: daemon not reachable ({reason})") from exc


def fetch_view(url: str, previous: DaemonView | None = None, token: str | None = None,
               timeout: float = 3.0) -> DaemonView:
    """Read ``/metrics`` and ``/v2/models/stats`` and build one :class:`DaemonView`.

    Raises:
        TopError: the daemon does not answer, or answers something that is not cuvil-edged's.
    """
    base = url.rstrip("/")
    metrics = parse_prometheus(_get(base + "/metrics", token, timeout).decode("utf-8", "replace"))
    try:
        stats = json.loads(_get(base + "/v2/models/stats", token, timeout))
    except json.JSONDecodeError as exc:
        raise TopError(f"{base}/v2/models/stats: not JSON ({exc})") from exc
    if not isinstance(stats, dict) or "model_stats" not in stats:
        raise TopError(f"{base}/v2/models/stats: no model_stats; is this a cuvil-edged?")
    now = time.monotonic()
    view = DaemonView(url=base, at=now)
    level = _one(metrics, "cuvil_memory_pressure_level")
    level_name = next(iter(_labelled(metrics, "cuvil_memory_pressure_level", "step")), None)
    rejecting = level is not None and level >= 5
    for entry in stats["model_stats"]:
        name, version = str(entry.get("name")), str(entry.get("version"))
        key = f"{name}:{version}"
        inf = entry.get("inference_stats", {})
        counts = (float(inf.get("success", {}).get("count", 0)), float(entry.get("inference_count", 0)),
                  float(entry.get("execution_count", 0)))
        view.counts[key] = counts
        row = ModelRow(name=name, version=version)
        lab = {"model": name, "version": version}
        row.queue = _one(metrics, "cuvil_model_queue_size", **lab)
        row.batch_cap = _one(metrics, "cuvil_model_batch_cap", **lab)
        row.p50_ms = _one(metrics, "cuvil_model_latency_p50_ms", **lab)
        row.p99_ms = _one(metrics, "cuvil_model_latency_p99_ms", **lab)
        row.rejected = _one(metrics, "cuvil_inference_rejected_total", **lab)
        row.depth = _one(metrics, "cuvil_prefetch_depth", **lab)
        row.need = _one(metrics, "cuvil_prefetch_need", **lab)
        row.depth_reason = next((labels.get("reason", "") for labels, _ in metrics.get("cuvil_prefetch_info", [])
                                 if labels.get("model") == name and labels.get("version") == version), "")
        if previous is not None and key in previous.counts and now > previous.at:
            p = previous.counts[key]
            dt = now - previous.at
            row.requests_per_s = max(0.0, (counts[0] - p[0]) / dt)
            if counts[2] > p[2]:
                row.mean_batch = (counts[1] - p[1]) / (counts[2] - p[2])
        if row.mean_batch is None and counts[2] > 0:
            row.mean_batch = counts[1] / counts[2]
        row.admission = "rejecting (503)" if rejecting else "open"
        view.models.append(row)
    view.memory = {
        "budget": _one(metrics, "cuvil_memory_budget_bytes"),
        "used": _one(metrics, "cuvil_memory_used_bytes"),
        "headroom": _one(metrics, "cuvil_memory_headroom_bytes"),
        "other": _one(metrics, "cuvil_memory_other_bytes"),
        "level": level,
        "level_name": level_name or (LEVEL_NAMES[int(level)] if level is not None and 0 <= level < 6 else None),
        "reason": next(iter(_labelled(metrics, "cuvil_memory_pressure_info", "reason")), None),
        "psi_some_avg10": _one(metrics, "cuvil_memory_psi_some_avg10"),
        "psi_full_avg10": _one(metrics, "cuvil_memory_psi_full_avg10"),
        "mem_available": _one(metrics, "cuvil_memory_available_bytes"),
        "cgroup_current": _one(metrics, "cuvil_memory_cgroup_current_bytes"),
        "cgroup_oom_kills": _one(metrics, "cuvil_memory_cgroup_oom_kill_total"),
    }
    view.board = {
        "gpu_pct": _one(metrics, "cuvil_board_gpu_utilization_percent"),
        "gpu_mhz": _one(metrics, "cuvil_board_gpu_frequency_mhz"),
        "emc_pct": _one(metrics, "cuvil_board_emc_utilization_percent"),
        "ram_used": _one(metrics, "cuvil_board_ram_used_bytes"),
        "ram_total": _one(metrics, "cuvil_board_ram_total_bytes"),
        "swap_used": _one(metrics, "cuvil_board_swap_used_bytes"),
        "power_mw": _labelled(metrics, "cuvil_board_power_milliwatts", "rail"),
        "temps_c": _labelled(metrics, "cuvil_board_temperature_celsius", "sensor"),
        "source": next(iter(_labelled(metrics, "cuvil_telemetry_source_up", "source")), None),
        "busy_pct": _one(metrics, "cuvil_daemon_busy_percent"),
    }
    return view


def _f(v: float | None, fmt: str = "{:.0f}", none: str = "-") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return none
    return fmt.format(v)


def _mib(v: float | None) -> str:
    return _f(None if v is None else v / MiB, "{:,.0f} MiB")


def render(view: DaemonView, error: str | None = None) -> Any:
    """The rich renderable of one view (a header, the model table, memory and board lines)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    header = Text.assemble(("cuvil-edge top", "bold"), f"  {view.url}  ",
                           (time.strftime("%H:%M:%S"), "dim"), "  (q quits)")
    if error:
        header.append(f"  stale: {error}", style="bold red")
    table = Table(expand=True, show_edge=False, pad_edge=False)
    for col, kw in (("model", {}), ("queue", {"justify": "right"}), ("batch", {"justify": "right"}),
                    ("req/s", {"justify": "right"}), ("p50 ms", {"justify": "right"}),
                    ("p99 ms", {"justify": "right"}), ("admission", {}), ("depth", {"justify": "right"}),
                    ("depth: last change", {"overflow": "ellipsis", "no_wrap": True, "ratio": 1})):
        table.add_column(col, **kw)
    if not view.models:
        table.add_row("(no model loaded)", *[""] * 8)
    for m in view.models:
        batch = f"{_f(m.mean_batch, '{:.1f}')}/{_f(m.batch_cap)}"
        depth = _f(m.depth) + (f" (need {_f(m.need)})" if m.need is not None else "")
        adm = m.admission + (f", {_f(m.rejected)} refused" if m.rejected else "")
        table.add_row(f"{m.name}:{m.version}", _f(m.queue), batch, _f(m.requests_per_s, "{:.1f}"),
                      _f(m.p50_ms, "{:.2f}"), _f(m.p99_ms, "{:.2f}"), adm, depth, m.depth_reason or "-")
    mem = view.memory
    level = mem.get("level")
    style = "green" if not level else ("yellow" if level < 4 else "bold red")
    memory = Text.assemble(
        ("memory ", "bold"), f"budget {_mib(mem.get('budget'))}  used {_mib(mem.get('used'))}  ",
        f"headroom {_mib(mem.get('headroom'))}  others {_mib(mem.get('other'))}  pressure ",
        (f"{mem.get('level_name') or '-'} ({_f(level)})", style),
    )
    if mem.get("reason") and mem.get("reason") != "ok":
        memory.append(f" {mem['reason']}", style=style)
    kernel = []
    if mem.get("mem_available") is not None:
        kernel.append(f"MemAvailable {_mib(mem['mem_available'])}")
    if mem.get("psi_some_avg10") is not None:
        kernel.append(f"PSI some {mem['psi_some_avg10']:.2f}% full {_f(mem.get('psi_full_avg10'), '{:.2f}')}%")
    if mem.get("cgroup_current") is not None:
        kernel.append(f"cgroup {_mib(mem['cgroup_current'])}, OOM kills {_f(mem.get('cgroup_oom_kills'))}")
    b = view.board
    ram = f"RAM {_f(None if b.get('ram_used') is None else b['ram_used'] / MiB, '{:,.0f}')}" \
          f"/{_f(None if b.get('ram_total') is None else b['ram_total'] / MiB, '{:,.0f}')} MiB"
    power = " ".join(f"{k} {v / 1000:.1f} W" for k, v in b.get("power_mw", {}).items()) or "power -"
    temps = " ".join(f"{k} {v:.0f}C" for k, v in b.get("temps_c", {}).items()) or "temps -"
    board = Text.assemble(
        ("board ", "bold"), f"GPU {_f(b.get('gpu_pct'))}% @ {_f(b.get('gpu_mhz'))} MHz  ",
        f"EMC {_f(b.get('emc_pct'))}%  {ram}  swap {_mib(b.get('swap_used'))}  ",
        f"daemon busy {_f(b.get('busy_pct'))}%  source {b.get('source') or '-'}",
    )
    lines = [header, table, memory]
    if kernel:
        lines.append(Text("kernel " + "  ".join(kernel)))
    lines += [board, Text(f"power {power}   temperatures {temps}")]
    return Group(*lines)


@contextlib.contextmanager
def _keys() -> Iterator[Any]:
    """Yield a ``poll(timeout) -> str | None`` reading single keys from a terminal stdin.

    cbreak mode (no echo, no line buffering) while the view runs; restored on any exit. Without a
    terminal (a pipe) keys are not read and only Ctrl-C ends the view.
    """
    fd = sys.stdin.fileno() if sys.stdin and sys.stdin.isatty() else None
    if fd is None:
        def sleep_only(timeout: float) -> str | None:
            time.sleep(timeout)
            return None

        yield sleep_only
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)

        def poll(timeout: float) -> str | None:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                return None
            data = os.read(fd, 32)
            return data.decode("utf-8", "replace") if data else None

        yield poll
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextlib.contextmanager
def ssh_forward(address: str, daemon_port: int = 8000, identity: str | None = None,
                known_hosts: str | None = None, connect_timeout: float = 15.0) -> Iterator[str]:
    """The daemon's URL on a remote board, through the SSH port forward deploy uses.

    The SSH connection runs on its own event loop in a thread for as long as the block.

    Raises:
        DeployError: the board cannot be reached or the forward cannot be opened.
    """
    import asyncio

    from cuvil_edge.deploy.transport import parse_address
    from cuvil_edge.deploy.transports import open_transport

    given = {"identity": identity, "known_hosts": known_hosts, "daemon_port": daemon_port}
    addr = parse_address(address, **{k: v for k, v in given.items() if v is not None})
    started = threading.Event()
    port: list[int] = []
    failure: list[BaseException] = []
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def hold() -> None:
        try:
            async with open_transport(addr, connect_timeout) as tr:
                async with tr.forward_local(addr.daemon_port) as local:
                    port.append(local)
                    started.set()
                    await stop.wait()
        except BaseException as exc:  # reported to the caller's thread
            failure.append(exc)
            started.set()

    thread = threading.Thread(target=loop.run_until_complete, args=(hold(),), name="top-ssh", daemon=True)
    thread.start()
    started.wait(connect_timeout + 5)
    try:
        if failure:
            raise failure[0]
        if not port:
            raise TopError(f"{addr.label}: SSH port forward did not open in {connect_timeout:.0f} s")
        yield f"http://127.0.0.1:{port[0]}"
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        if not thread.is_alive():
            loop.close()


def run_top(url: str, interval: float = 1.0, token: str | None = None, once: bool = False,
            console: Any = None) -> int:
    """Show the live view until ``q`` or Ctrl-C; returns the exit code.

    Args:
        url (str): the daemon's base URL (``http://127.0.0.1:8000``).
        interval (float): seconds between refreshes. Defaults to 1.
        token (str | None): bearer token, when the daemon asks for one. Defaults to None.
        once (bool): print one view (two reads, ``interval`` apart, for the rates) and return.
        console (Console | None): rich console. Defaults to a new one on stdout.

    Raises:
        TopError: the first read fails (later failures show as a stale view and keep trying).
    """
    from rich.console import Console
    from rich.live import Live

    if console is None:
        if not once and sys.stdout.isatty():
            # A full-screen view follows the terminal's size. COLUMNS and LINES in the environment
            # (some shells and tools export them) are a size from when they were set: rich would
            # keep it for good, cutting the table to 80 columns in a wider pane, ignoring resizes.
            for name in ("COLUMNS", "LINES"):
                os.environ.pop(name, None)
        console = Console()
    view = fetch_view(url, token=token)
    if once:
        time.sleep(interval)
        console.print(render(fetch_view(url, view, token=token)))
        return 0
    try:
        # The alternate screen, as top(1): the view owns the terminal while it runs and the
        # shell's screen comes back on exit.
        with _keys() as poll, Live(render(view), console=console, screen=True, auto_refresh=False,
                                   vertical_overflow="crop") as live:
            next_at = time.monotonic() + interval
            while True:
                key = poll(max(0.0, next_at - time.monotonic()))
                if key and key.lower().startswith("q"):
                    break
                if time.monotonic() < next_at:
                    continue
                next_at = time.monotonic() + interval
                try:
                    view = fetch_view(url, view, token=token)
                    live.update(render(view), refresh=True)
                except TopError as exc:
                    live.update(render(view, error=str(exc)), refresh=True)
    except KeyboardInterrupt:
        pass
    console.print("cuvil-edge top: bye")
    return 0


def register(app: Any) -> None:
    """Add ``cuvil-edge top`` to the CLI."""
    import typer

    @app.command("top")
    def top_cmd(
        url: str = typer.Option("http://127.0.0.1:8000", "--url", help="Daemon base URL."),
        ssh: str = typer.Option(None, "--ssh", help="Reach a board's daemon through SSH: \\[user@]host\\[:port]."),
        daemon_port: int = typer.Option(8000, "--daemon-port", help="Daemon port on the board's loopback (--ssh)."),
        identity: Path = typer.Option(None, "--identity", "-i", help="SSH private key (--ssh)."),
        known_hosts: Path = typer.Option(None, "--known-hosts", help="known_hosts file (--ssh)."),
        token: str = typer.Option(None, "--daemon-token", "--token", help="Bearer token of the daemon."),
        interval: float = typer.Option(1.0, "--interval", min=0.1, help="Seconds between refreshes."),
        once: bool = typer.Option(False, "--once", help="Print one view and exit (scripts, logs)."),
    ) -> None:
        """Live view of a running cuvil-edged: models, memory, prefetch, board. q or Ctrl-C quits."""
        if ssh:
            with ssh_forward(ssh, daemon_port, str(identity.expanduser()) if identity else None,
                             str(known_hosts.expanduser()) if known_hosts else None) as forwarded:
                raise typer.Exit(run_top(forwarded, interval, token, once))
        raise typer.Exit(run_top(url, interval, token, once))
