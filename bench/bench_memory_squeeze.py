#!/usr/bin/env python3
"""Memory squeeze on a real kernel: cuvil-edged under tritonclient load while a memory hog and a CPU
hog run beside it, with the memory co-scheduler reading the kernel (on) or blind to it (off).

Targets:

* ``host-cgroup`` (runs here, as root): the "board" is a memory cgroup on this machine whose
  limit is the daemon's measured footprint plus ``--headroom-mb``; the daemon and the hog run
  inside it, so the kernel's memcg OOM killer and reclaim act exactly as on a board with that much
  RAM. On: the daemon reads its cgroup (limit, usage, OOM kills), ``/proc/meminfo`` and PSI
  (``KernelMemory``). Off: ``CUVIL_EDGED_KERNEL_MEMORY=0`` and no telemetry, so its ladder never
  sees the squeeze (what a daemon without the co-scheduler does).
* ``qemu-system``: the emulated arm64 board of the HIL rig (``hil.board.boot``, 2 GiB RAM, Debian
  with systemd as PID 1, no swap). The project and the daemon are installed with the HIL suite's
  own steps (``cuvil-edge install-daemon``, ``cuvil-edge deploy``); the daemon runs as the
  ``cuvil-edged`` unit and serves the suite's ``hilnet`` under load plus three idle ``vault-*``
  models with 160 MiB of weights each. On: ``--telemetry auto`` (sysfs on this board) and the
  kernel's signals. Off: neither (``CUVIL_EDGED_KERNEL_MEMORY=0``). The squeeze is a protected
  neighbour service growing to MemAvailable + ``--overshoot-mb`` beside ``stress-ng --cpu 1``
  (:func:`board_mode` says why the neighbour is not ``stress-ng --vm``); OOM kills are read
  from the board's kernel log. Results, a per-second trace and a plot
  (``memory_squeeze_board.png``) go to the ``qemu-system`` entry.

Timeline per mode: ``--baseline`` s of load alone, then the squeeze for ``--squeeze`` s (host-cgroup:
``stress-ng --vm 1 --vm-bytes <headroom x --hog-factor> --vm-keep`` plus ``stress-ng --cpu 1``;
qemu-system: see above), then ``--recovery`` s of load alone. Measured: daemon OOM kills (the daemon process ended by SIGKILL)
and OOM kills in the cgroup, requests served, 503s and whether they carried ``Retry-After``, p50 and
p99 of served requests per phase, and the recovery time: from the hog's exit until a one-second
window serves at least 90% of the baseline rate with no 503. Results go to the ``memory_squeeze``
section of ``bench/results/memory_squeeze.json`` with the command that produced them.

Usage::

    sudo .venv/bin/python bench/bench_memory_squeeze.py --target host-cgroup
    .venv/bin/python bench/bench_memory_squeeze.py --target qemu-system   # about 25 min under TCG
    .venv/bin/python bench/bench_memory_squeeze.py --target qemu-orin-nano --modes on  # L4T 36: PSI off
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MiB = 1024 * 1024


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, max(0, int(q / 100 * len(s) + 0.5) - 1))], 2)


class MemCgroup:
    """A memory cgroup (v2 if the unified hierarchy delegates memory here, else v1) with a limit."""

    def __init__(self, name: str) -> None:
        v2 = Path("/sys/fs/cgroup")
        if (v2 / "cgroup.controllers").exists() and "memory" in (v2 / "cgroup.subtree_control").read_text():
            self.path, self.version = v2 / name, 2
        elif Path("/sys/fs/cgroup/memory").is_dir():
            self.path, self.version = Path("/sys/fs/cgroup/memory") / name, 1
        else:
            raise SystemExit("bench_memory_squeeze: no writable memory cgroup (v1 or v2) on this machine")
        try:
            self.path.mkdir()
        except OSError as exc:
            raise SystemExit(f"bench_memory_squeeze: cannot create {self.path}: {exc.strerror} (run as root)") from exc

    def _f(self, v1: str, v2: str) -> Path:
        return self.path / (v2 if self.version == 2 else v1)

    def set_limit(self, nbytes: int) -> None:
        self._f("memory.limit_in_bytes", "memory.max").write_text(str(int(nbytes)))

    def usage(self) -> int:
        return int(self._f("memory.usage_in_bytes", "memory.current").read_text())

    def oom_kills(self) -> int:
        text = self._f("memory.oom_control", "memory.events").read_text()
        for line in text.splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill":
                return int(v)
        return 0

    def wrap(self, argv: list[str]) -> list[str]:
        """argv that joins this cgroup before exec'ing the command."""
        procs = self.path / "cgroup.procs"
        return ["sh", "-c", f"echo $$ > {shlex.quote(str(procs))} && exec " + " ".join(shlex.quote(a) for a in argv)]

    def remove(self) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


class Load:
    """Client threads calling infer through tritonclient; every answer is recorded with its time."""

    def __init__(self, url: str, threads: int, model: str, shape: tuple[int, ...]) -> None:
        self.url, self.model, self.shape = url, model, shape
        self.records: list[tuple[float, str, float]] = []  # (t, "ok" | "503" | "error", latency ms)
        self.retry_after: list[bool] = []
        self.error_kinds: dict[str, int] = {}  # first words of each error, counted
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]
        self._probe = threading.Thread(target=self._probe_503, daemon=True)

    def start(self) -> None:
        for t in self._threads:
            t.start()
        self._probe.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)
        self._probe.join(30)

    def _run(self) -> None:
        import numpy as np
        import tritonclient.http as httpclient
        from tritonclient.utils import InferenceServerException

        x = np.random.default_rng(0).random(self.shape, dtype=np.float32)
        client = httpclient.InferenceServerClient(self.url, connection_timeout=10, network_timeout=30)
        try:
            while not self._stop.is_set():
                inp = httpclient.InferInput("input", list(x.shape), "FP32")
                inp.set_data_from_numpy(x, binary_data=True)
                t0 = time.monotonic()
                try:
                    client.infer(self.model, [inp])
                    kind = "ok"
                except InferenceServerException as exc:
                    kind = "503" if str(exc.status()) == "503" or "503" in str(exc) else "error"
                    if kind == "error":
                        self._count_error(str(exc))
                except Exception as exc:
                    kind = "error"
                    self._count_error(f"{type(exc).__name__}: {exc}")
                    time.sleep(0.2)  # the daemon is down: do not spin
                with self._lock:
                    self.records.append((time.monotonic(), kind, (time.monotonic() - t0) * 1000))
                if kind == "503":
                    time.sleep(0.05)
        finally:
            client.close()

    def _count_error(self, text: str) -> None:
        key = " ".join(text.split()[:8])[:100]
        with self._lock:
            self.error_kinds[key] = self.error_kinds.get(key, 0) + 1

    def _probe_503(self) -> None:
        """A raw request twice a second, to see the Retry-After header tritonclient does not show."""
        body = json.dumps({"inputs": [{"name": "input", "shape": list(self.shape), "datatype": "FP32",
                                       "data": [0.0] * int(math.prod(self.shape))}]}).encode()
        while not self._stop.wait(0.5):
            req = urllib.request.Request(f"http://{self.url}/v2/models/{self.model}/infer", data=body,
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=10):
                    pass
            except urllib.error.HTTPError as exc:
                if exc.code == 503:
                    with self._lock:
                        self.retry_after.append(exc.headers.get("Retry-After") is not None)
            except OSError:
                pass


def _phase(records: list[tuple[float, str, float]], a: float, b: float) -> dict[str, Any]:
    rows = [r for r in records if a <= r[0] < b]
    ok = [ms for _, k, ms in rows if k == "ok"]
    dur = max(1e-9, b - a)
    return {"seconds": round(b - a, 1), "served": len(ok), "served_per_s": round(len(ok) / dur, 1),
            "503": sum(1 for _, k, _ in rows if k == "503"), "errors": sum(1 for _, k, _ in rows if k == "error"),
            "p50_ms": _pct(ok, 50), "p99_ms": _pct(ok, 99)}


def _recovery(records: list[tuple[float, str, float]], hog_end: float, end: float, baseline_rate: float) -> float | None:
    t = hog_end
    while t + 1.0 <= end:
        win = [k for (ts, k, _) in records if t <= ts < t + 1.0]
        if win.count("ok") >= 0.9 * baseline_rate and "503" not in win:
            return round(t - hog_end, 2)
        t += 0.25
    return None


def _make_store(dest: Path) -> tuple[Path, str, tuple[int, ...]]:
    """A store with the digits CNN (the serving tests' real model) as ``digits`` 1.0.0."""
    sys.path.insert(0, str(ROOT / "tests" / "daemon"))
    from conftest import install, make_bundle  # the serving tests' bundle writer

    from cuvil_edge.models import build_digits_cnn

    model = build_digits_cnn(dest / "digits.onnx")
    bundle = make_bundle(dest / "src" / "digits-1.0.0", model, "digits", "1.0.0", latency_p95_ms=50)
    (dest / "store").mkdir()
    install(dest / "store", bundle)
    return dest / "store", "digits", (8, 1, 8, 8)


def _wait_ready(log: Path, proc: subprocess.Popen, timeout: float = 90.0) -> str:
    import re

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(r"ready on http://(\S+?)[ ,\n]", log.read_text(errors="replace") + "\n")
        if m:
            return m.group(1)
        if proc.poll() is not None:
            raise SystemExit(f"daemon exited {proc.returncode} before ready:\n{log.read_text()[-2000:]}")
        time.sleep(0.1)
    raise SystemExit(f"daemon not ready after {timeout} s")


def host_cgroup_mode(mode: str, args: argparse.Namespace, store: Path, model: str, shape: tuple[int, ...],
                     workdir: Path) -> dict[str, Any]:
    cg = MemCgroup(f"cuvil-squeeze-{os.getpid()}-{mode}")
    log = workdir / f"daemon-{mode}.log"
    env = dict(os.environ)
    if mode == "off":
        env["CUVIL_EDGED_KERNEL_MEMORY"] = "0"
    daemon = hog = cpu = None
    try:
        with open(log, "wb") as out:
            daemon = subprocess.Popen(cg.wrap([sys.executable, "-m", "cuvil_edge.daemon.main", "--store", str(store),
                                               "--port", "0", "--tick", "0.25"]),
                                      stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
            url = _wait_ready(log, daemon)
        load = Load(url, args.threads, model, shape)
        t0 = time.monotonic()
        load.start()
        time.sleep(min(5.0, args.baseline / 2))
        footprint = cg.usage()
        limit = footprint + args.headroom_mb * MiB
        cg.set_limit(limit)
        time.sleep(max(0.0, args.baseline - (time.monotonic() - t0)))
        hog_bytes = int(args.headroom_mb * args.hog_factor)
        hog_start = time.monotonic()
        hog = subprocess.Popen(cg.wrap(["stress-ng", "--vm", "1", "--vm-bytes", f"{hog_bytes}M", "--vm-keep",
                                        "--timeout", f"{int(args.squeeze)}s", "--quiet"]),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cpu = subprocess.Popen(["stress-ng", "--cpu", "1", "--timeout", f"{int(args.squeeze)}s", "--quiet"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        peak = footprint
        while hog.poll() is None and time.monotonic() - hog_start < args.squeeze + 30:
            peak = max(peak, cg.usage())
            time.sleep(0.1)
        hog_end = time.monotonic()
        time.sleep(args.recovery)
        load.stop()
        end = time.monotonic()
        daemon_rc = daemon.poll()
        recs = load.records
        base = _phase(recs, t0 + 5.0, hog_start)
        result = {
            "mode": mode,
            "cgroup": {"version": cg.version, "limit_mb": round(limit / MiB), "daemon_footprint_mb": round(footprint / MiB),
                       "headroom_mb": args.headroom_mb, "hog_mb": hog_bytes, "peak_usage_mb": round(peak / MiB),
                       "oom_kills": cg.oom_kills()},
            "daemon_oom_killed": daemon_rc is not None and daemon_rc in (-signal.SIGKILL, 128 + signal.SIGKILL, 137),
            "daemon_exit": daemon_rc,
            "baseline": base,
            "squeeze": _phase(recs, hog_start, hog_end),
            "recovery": _phase(recs, hog_end, end),
            "recovery_s": _recovery(recs, hog_end, end, base["served_per_s"]),
            "retry_after_on_503": (sum(load.retry_after), len(load.retry_after)),
            "daemon_log_pressure": [ln for ln in log.read_text(errors="replace").splitlines()
                                    if "memory pressure" in ln][-8:],
        }
        return result
    finally:
        for p in (hog, cpu, daemon):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        cg.remove()



# ---------------------------------------------------------------------------------------------
# qemu-system: the emulated arm64 board of the HIL rig, the daemon under systemd

HOG_OOM_ADJ = -900  # the neighbour service the board protects (see board_mode's docstring)
VAULT_MODELS = ("vault-a", "vault-b", "vault-c")


# The neighbour: grows to ``argv[1]`` MiB over ``argv[2]`` s in 16 MiB anonymous mappings, every
# page written, holds them until ``argv[3]`` s after its start, then exits. Logs what it holds.
NEIGHBOUR = """import mmap, sys, time
target, ramp, hold = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
t0, step, held = time.monotonic(), 16, []
n = max(1, target // step)
for i in range(n):
    m = mmap.mmap(-1, step << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for off in range(0, step << 20, 4096):
        m[off] = 1
    held.append(m)
    time.sleep(max(0.0, t0 + ramp * (i + 1) / n - time.monotonic()))
print(f"holding {len(held) * step} MiB after {time.monotonic() - t0:.1f} s", flush=True)
time.sleep(max(0.0, t0 + hold - time.monotonic()))
"""

def _vault_model(path: Path, mb: int, seed: int) -> Path:
    """A real ONNX model whose weights are ``mb`` MiB: ``y = x @ W`` with x ``[N, 256]`` FP32."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    width = mb * MiB // (4 * 256)
    w = np.random.default_rng(seed).standard_normal((256, width), dtype=np.float32) * 0.01
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], path.stem,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


class BoardProbe:
    """The board's own view, once a second, written on the board and fetched at the end:
    MemAvailable, PSI ``some``/``full`` avg10, the daemon's PID, restarts and cgroup usage."""

    SCRIPT = ("while :; do m=$(awk '/MemAvailable/{print $2}' /proc/meminfo); "
              "p=$(awk '{print $2}' /proc/pressure/memory 2>/dev/null | tr '\\n' ' '); "
              "[ -n \"$p\" ] || p='avg10=nan avg10=nan'; "
              "u=$(systemctl show -p MainPID,NRestarts --value cuvil-edged.service | tr '\\n' ' '); "
              "c=$(cat /sys/fs/cgroup/system.slice/cuvil-edged.service/memory.current 2>/dev/null || echo 0); "
              "echo \"$(date +%s.%N) $m $p $u $c\"; sleep 1; done > /tmp/cuvil-squeeze-probe.txt")

    def __init__(self, board: Any) -> None:
        self.board = board

    def start(self) -> None:
        self.board.ssh("systemctl stop cuvil-squeeze-probe 2>/dev/null; rm -f /tmp/cuvil-squeeze-probe.txt; "
                       f"systemd-run --quiet --unit=cuvil-squeeze-probe sh -c {shlex.quote(self.SCRIPT)}")

    def stop(self, offset: float) -> list[dict[str, Any]]:
        """Rows with ``t`` in this machine's monotonic seconds (``offset`` = board epoch - monotonic)."""
        out = self.board.ssh("systemctl stop cuvil-squeeze-probe; cat /tmp/cuvil-squeeze-probe.txt",
                             check=False).stdout
        rows = []
        for line in out.splitlines():
            f = line.replace("avg10=", "").split()
            if len(f) < 7:
                continue
            try:
                rows.append({"t": float(f[0]) - offset, "mem_available_mb": round(int(f[1]) / 1024),
                             "psi_some_avg10": _psi(f[2]), "psi_full_avg10": _psi(f[3]), "pid": int(f[4]),
                             "restarts": int(f[5]), "cgroup_mb": round(int(f[6]) / MiB)})
            except ValueError:
                continue
        return rows


def _psi(field: str) -> float | None:
    """A PSI avg10 figure, or None where the kernel has no PSI (L4T 36: psi=0, no /proc/pressure)."""
    return None if field == "nan" else float(field)


def _board_clock_offset(board: Any) -> float:
    """Board epoch seconds minus this machine's monotonic clock (half an SSH round trip of error)."""
    t0 = time.monotonic()
    epoch = float(board.ssh("date +%s.%N").stdout)
    return epoch - (t0 + time.monotonic()) / 2


def _board_oom_kills(board: Any, since_epoch: float) -> list[dict[str, Any]]:
    """The kernel's OOM kills since ``since_epoch``: who was killed, its RSS and oom_score_adj."""
    import re

    out = board.ssh(f"journalctl -k --no-pager -o short-unix --since=@{int(since_epoch)}", check=False).stdout
    kills = []
    for line in out.splitlines():
        m = re.search(r"Out of memory: Killed process (\d+) \(([^)]*)\).*?anon-rss:(\d+)kB.*?oom_score_adj:(-?\d+)",
                      line)
        if m:
            kills.append({"t": float(line.split()[0]), "pid": int(m.group(1)), "comm": m.group(2),
                          "anon_rss_mb": round(int(m.group(3)) / 1024), "oom_score_adj": int(m.group(4))})
    return kills


def _write_mode_dropin(board: Any, mode: str, tick: float) -> None:
    """The daemon as the HIL rig runs it, with the co-scheduler reading the kernel (on) or blind (off)."""
    from hil.suite import DAEMON_PORT, DROPIN_DIR

    telemetry = " --telemetry auto" if mode == "on" else ""
    lines = ["# bench_memory_squeeze: mode " + mode, "[Service]",
             "ExecStart=",
             f"ExecStart=/usr/local/bin/cuvil-edged --store /var/lib/cuvil-edge --host 0.0.0.0 --port {DAEMON_PORT}"
             f" --tick {tick}{telemetry}",
             "IPAddressAllow=10.0.2.2",
             f"Environment=CUVIL_EDGED_KERNEL_MEMORY={1 if mode == 'on' else 0}"]
    board.ssh(f"mkdir -p {DROPIN_DIR} && rm -f {DROPIN_DIR}/*.conf && cat > {DROPIN_DIR}/squeeze.conf",
              input="\n".join(lines) + "\n")
    board.ssh("systemctl daemon-reload")


def _models_ready(url: str, names: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pending = list(names)
    while pending and time.monotonic() < deadline:
        name = pending[0]
        try:
            with urllib.request.urlopen(f"http://{url}/v2/models/{name}/ready", timeout=10) as r:
                if r.status == 200:
                    pending.pop(0)
                    continue
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1)
    if pending:
        raise SystemExit(f"bench_memory_squeeze: models not ready on the board within {timeout:.0f} s: {pending}")


def prepare_board(ctx: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Installs the project and the daemon (the HIL suite's own steps), deploys the hot model
    (the suite's ``hilnet``) and the idle ``vault-*`` models with ``cuvil-edge deploy``."""
    from rich.progress import Progress

    from hil.bundles import make_bundle
    from hil.suite import check_deploy_fresh, check_install_daemon, check_install_project

    info: dict[str, Any] = {}
    with Progress(console=None, transient=True) as progress:
        task = progress.add_task("board: install project", total=3 + len(VAULT_MODELS))
        info["project"] = check_install_project(ctx)
        progress.update(task, advance=1, description="board: install daemon")
        info["daemon"] = check_install_daemon(ctx)
        progress.update(task, advance=1, description="board: deploy hilnet")
        info["hilnet"] = check_deploy_fresh(ctx)["deploy"]
        progress.update(task, advance=1)
        import numpy as np

        for i, name in enumerate(VAULT_MODELS):
            progress.update(task, description=f"board: deploy {name} ({args.vault_mb} MiB)")
            model = _vault_model(ctx.workdir / "vault" / f"{name}.onnx", args.vault_mb, seed=i)
            sample = {"x": np.random.default_rng(100 + i).standard_normal((1, 256)).astype(np.float32)}
            width = args.vault_mb * MiB // (4 * 256)
            bundle = make_bundle(ctx.workdir / "vault" / f"{name}-1.0.0.cvb", ctx.keys()[0], model, name, "1.0.0",
                                 sample, {"y": width}, max_batch=1)
            model.unlink()
            report = ctx.workdir / f"deploy-{name}.json"
            res = ctx.cli("deploy", str(bundle), *ctx.device_args(), "--pub", str(ctx.keys()[1]),
                          "--health-timeout", "600", "--confirm-deadline", "700", "--connect-timeout", "30",
                          "--report", str(report), "--json", timeout=900)
            bundle.unlink()
            if res.returncode != 0:
                raise SystemExit(f"bench_memory_squeeze: deploy of {name} exited {res.returncode}: "
                                 f"{(res.stderr or res.stdout).strip()[-800:]}")
            progress.update(task, advance=1)
    return info


def board_mode(ctx: Any, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """One mode on the board: load alone, then a squeeze, then load alone again.

    The squeeze is a neighbour service that grows past what the board has left: over ``--ramp``
    seconds it writes anonymous memory up to MemAvailable (read at the squeeze's start) plus
    ``--overshoot-mb``, holds it for the rest of ``--squeeze`` seconds, and leaves; ``stress-ng
    --cpu 1`` runs beside it for the same time. Both are transient systemd services. The neighbour
    stands for a service the board protects (a camera pipeline, a robot's control stack:
    ``OOMScoreAdjust=-900``), so when RAM runs out the kernel's OOM killer picks among the other
    processes, as it would on such a board. It is a small Python program, not ``stress-ng --vm``:
    stress-ng marks its own workers as the OOM killer's first victims (``oom_score_adj`` 1000)
    and, on this board, its vm workers backed off under pressure without ever holding their size
    (bogo-op counters zero), so they never pressed the daemon. The daemon serves the suite's
    ``hilnet`` under tritonclient load and holds the idle ``vault-*`` models, which the
    co-scheduler may unload under pressure (on) and cannot see the need to (off).
    """
    from hil.suite import DAEMON_PORT, UNIT

    board = ctx.board
    board.ssh("systemctl stop 'cuvil-squeeze-*' 2>/dev/null; systemctl reset-failed 'cuvil-squeeze-*' 2>/dev/null; "
              "sync; echo 3 > /proc/sys/vm/drop_caches", check=False)
    _write_mode_dropin(board, mode, args.tick)
    board.ssh(["systemctl", "restart", UNIT], timeout=600)
    ctx.wait_unit("active", "running", timeout=600)
    url = f"127.0.0.1:{board.port(DAEMON_PORT)}"
    _models_ready(url, ["hilnet", *VAULT_MODELS], 600)
    restarts0 = int(ctx.unit_state().get("NRestarts", "0") or 0)
    offset = _board_clock_offset(board)
    epoch0 = time.monotonic() + offset
    probe = BoardProbe(board)
    probe.start()
    load = Load(url, args.threads, "hilnet", (4, 3, 16, 16))
    t0 = time.monotonic()
    load.start()
    time.sleep(args.baseline)
    avail_mb = int(board.ssh("awk '/MemAvailable/{print int($2/1024)}' /proc/meminfo").stdout)
    hog_mb = avail_mb + args.overshoot_mb
    squeeze_s = int(args.squeeze)
    board.ssh("cat > /tmp/cuvil-squeeze-neighbour.py", input=NEIGHBOUR)
    hog_start = time.monotonic()
    board.ssh(f"systemd-run --quiet --unit=cuvil-squeeze-cpu stress-ng --cpu 1 --timeout {squeeze_s}s --quiet; "
              f"systemd-run --quiet --unit=cuvil-squeeze-neighbour -p OOMScoreAdjust={HOG_OOM_ADJ} "
              f"python3 /tmp/cuvil-squeeze-neighbour.py {hog_mb} {args.ramp} {squeeze_s}")
    time.sleep(squeeze_s)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the neighbour's last process has left
        if board.ssh("pgrep -x stress-ng || pgrep -f cuvil-squeeze-neighbour", check=False).returncode != 0:
            break
        time.sleep(1)
    hog_end = time.monotonic()
    time.sleep(args.recovery)
    load.stop()
    end = time.monotonic()
    trace = probe.stop(offset)
    board.ssh("systemctl stop 'cuvil-squeeze-*' 2>/dev/null", check=False)
    kills = _board_oom_kills(board, epoch0)
    state = ctx.unit_state()
    daemon_pids = {r["pid"] for r in trace if r["pid"]}
    daemon_kills = [k for k in kills if k["pid"] in daemon_pids or k["comm"] == "cuvil-edged"]
    journal = board.ssh(["journalctl", "-u", UNIT, "--no-pager", "-o", "cat", f"--since=@{int(epoch0)}"],
                        check=False).stdout
    recs = load.records
    base = _phase(recs, t0 + 2.0, hog_start)
    for row in trace:
        row["t"] = round(row["t"] - t0, 1)
    return {
        "mode": mode,
        "board": {"mem_mb": args.mem_mb, "mem_available_before_squeeze_mb": avail_mb,
                  "neighbour_mb": hog_mb, "neighbour_ramp_s": args.ramp,
                  "neighbour_oom_score_adj": HOG_OOM_ADJ,
                  "min_mem_available_mb": min((r["mem_available_mb"] for r in trace), default=None),
                  "max_psi_some_avg10": max((r["psi_some_avg10"] for r in trace if r["psi_some_avg10"] is not None),
                                            default=None),
                  "max_psi_full_avg10": max((r["psi_full_avg10"] for r in trace if r["psi_full_avg10"] is not None),
                                            default=None),
                  "daemon_cgroup_peak_mb": max((r["cgroup_mb"] for r in trace), default=None)},
        "oom_kills": kills,
        "daemon_oom_kills": len(daemon_kills),
        "daemon_restarts": int(state.get("NRestarts", "0") or 0) - restarts0,
        "baseline": base,
        "squeeze": _phase(recs, hog_start, hog_end),
        "recovery": _phase(recs, hog_end, end),
        "recovery_s": _recovery(recs, hog_end, end, base["served_per_s"]),
        "retry_after_on_503": (sum(load.retry_after), len(load.retry_after)),
        "errors_by_kind": dict(sorted(load.error_kinds.items(), key=lambda kv: -kv[1])[:8]),
        "phases_s": {"squeeze_start": round(hog_start - t0, 1), "squeeze_end": round(hog_end - t0, 1),
                     "end": round(end - t0, 1)},
        # A reload ping-pong (unloads and reloads far past the number of idle models) shows here.
        "ladder_unloads": journal.count("unloading the least recently used idle model"),
        "ladder_reloads": journal.count("memory pressure over: loading"),
        "daemon_log_pressure": [ln for ln in journal.splitlines() if "memory pressure" in ln][-40:],
        "trace": trace,
        "served_per_s_trace": _rate_trace(recs, t0, end),
    }


def _rate_trace(records: list[tuple[float, str, float]], t0: float, end: float) -> list[list[float]]:
    """[t, served/s, 503/s, errors/s] per second since ``t0``."""
    rows = []
    t = t0
    while t < end:
        win = [k for (ts, k, _) in records if t <= ts < t + 1.0]
        rows.append([round(t - t0, 1), win.count("ok"), win.count("503"), win.count("error")])
        t += 1.0
    return rows


def plot_board(entry: dict[str, Any], out: Path) -> Path:
    """Requests served and refused per second, and the board's MemAvailable, per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = entry["modes"]
    fig, axes = plt.subplots(2, len(modes), figsize=(6 * len(modes), 6), sharex=True, squeeze=False)
    for col, (mode, r) in enumerate(modes.items()):
        rate = r["served_per_s_trace"]
        t = [row[0] for row in rate]
        top, bottom = axes[0][col], axes[1][col]
        top.plot(t, [row[1] for row in rate], label="served/s", color="tab:green")
        top.plot(t, [row[2] for row in rate], label="503/s (Retry-After)", color="tab:orange")
        top.plot(t, [row[3] for row in rate], label="errors/s (daemon gone)", color="tab:red")
        kills = r["daemon_oom_kills"]
        top.set_title(f"scheduler {mode}: daemon OOM kills {kills}, restarts {r['daemon_restarts']}")
        bottom.plot([x["t"] for x in r["trace"]], [x["mem_available_mb"] for x in r["trace"]],
                    label="MemAvailable, MiB", color="tab:blue")
        bottom.plot([x["t"] for x in r["trace"]], [x["cgroup_mb"] for x in r["trace"]],
                    label="daemon unit memory.current, MiB", color="tab:purple")
        for ax in (top, bottom):
            ax.axvspan(r["phases_s"]["squeeze_start"], r["phases_s"]["squeeze_end"], color="grey", alpha=0.15)
            ax.legend(fontsize=7, loc="upper right")
        bottom.set_xlabel("seconds (grey: the neighbour holds memory)")
    fig.suptitle(f"memory squeeze on the emulated arm64 board ({entry['board'].get('mem_mb')} MiB, systemd)")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def qemu_system(args: argparse.Namespace) -> dict[str, Any]:
    """Boots the emulated board, prepares it once, runs each mode on it."""
    from hil.board import boot
    from hil.suite import DAEMON_PORT, SuiteContext

    workdir = Path(tempfile.mkdtemp(prefix="cuvil-squeeze-board-"))
    results: dict[str, Any] = {}
    with boot(args.target, mem_mb=args.mem_mb, forwards=(DAEMON_PORT,)) as board:
        ctx = SuiteContext(board=board, workdir=workdir)
        info = prepare_board(ctx, args)
        facts = board.facts()
        for mode in args.modes.split(","):
            print(f"== {mode}", flush=True)
            results[mode] = board_mode(ctx, mode, args)
            r = results[mode]
            print(json.dumps({k: r[k] for k in ("board", "daemon_oom_kills", "daemon_restarts", "baseline", "squeeze",
                                                "recovery", "recovery_s", "retry_after_on_503",
                                                "ladder_unloads", "ladder_reloads")}, indent=1), flush=True)
    shutil.rmtree(workdir, ignore_errors=True)
    return {"board": {**facts, "boot_seconds": board.boot_seconds, "cpu": board.target.cpu,
                      "smp": board.target.smp, "mem_mb": args.mem_mb, "accel": "tcg (emulated, no KVM)"},
            "prepared": {"daemon_ready_s": info["daemon"].get("ready_seconds")},
            "modes": results}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", choices=["host-cgroup", "qemu-system", "qemu-orin-nano"], default="host-cgroup")
    ap.add_argument("--modes", default="off,on")
    ap.add_argument("--threads", type=int, default=4, help="tritonclient load threads")
    ap.add_argument("--baseline", type=float, default=None, help="s of load alone (15; qemu-system 30)")
    ap.add_argument("--squeeze", type=float, default=None, help="s the hogs run (20; qemu-system 45)")
    ap.add_argument("--recovery", type=float, default=None, help="s of load after (15; qemu-system 240)")
    ap.add_argument("--headroom-mb", type=int, default=256, help="cgroup limit = daemon footprint + this")
    ap.add_argument("--hog-factor", type=float, default=1.25, help="hog size as a multiple of the headroom")
    ap.add_argument("--mem-mb", type=int, default=2048, help="qemu-system: the board's RAM, MiB")
    ap.add_argument("--vault-mb", type=int, default=160, help="qemu-system: weights of each idle vault-* model, MiB")
    ap.add_argument("--overshoot-mb", type=int, default=256,
                    help="qemu-system: the neighbour grows to MemAvailable + this")
    ap.add_argument("--ramp", type=float, default=15.0, help="qemu-system: seconds the neighbour takes to grow")
    ap.add_argument("--tick", type=float, default=0.5, help="the daemon's --tick (telemetry and ladder), s")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "memory_squeeze.json")
    args = ap.parse_args(argv)
    board = args.target.startswith("qemu-")  # emulated: slower starts, a daemon restart takes minutes
    for name, here, emulated in (("baseline", 15.0, 30.0), ("squeeze", 20.0, 45.0), ("recovery", 15.0, 240.0)):
        if getattr(args, name) is None:
            setattr(args, name, emulated if board else here)
    command = "python bench/bench_memory_squeeze.py " + " ".join(sys.argv[1:] if argv is None else argv)
    doc: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    section = doc.get("memory_squeeze", {})
    if "target" in section:  # the single-target layout of earlier runs
        section = {section["target"]: section}
    if board:
        entry = {"target": args.target, "command": command, **qemu_system(args),
                 "model": "hilnet (the HIL suite's classifier, [4, 3, 16, 16] FP32 per request) under load; "
                          f"{len(VAULT_MODELS)} idle vault-* models of {args.vault_mb} MiB weights each"}
        if args.target == "qemu-orin-nano":
            entry["personality"] = ("L4T 36 (JetPack 6.2) Orin Nano personality: psi=0 (no /proc/pressure), "
                                    "telemetry from the tegrastats stand-in")
        section[args.target] = entry
        png = "memory_squeeze_board.png" if args.target == "qemu-system" else "memory_squeeze_orin.png"
        entry["plot"] = plot_board(entry, args.out.with_name(png)).name
        doc["memory_squeeze"] = section
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {args.out}")
        return 0
    if shutil.which("stress-ng") is None:
        print("bench_memory_squeeze: stress-ng is not installed (apt-get install stress-ng)", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="cuvil-squeeze-"))
    store, model, shape = _make_store(workdir)
    results = {}
    for mode in args.modes.split(","):
        print(f"== {mode}", flush=True)
        results[mode] = host_cgroup_mode(mode, args, store, model, shape, workdir)
        r = results[mode]
        print(json.dumps({k: r[k] for k in ("cgroup", "daemon_oom_killed", "baseline", "squeeze", "recovery",
                                            "recovery_s", "retry_after_on_503")}, indent=1), flush=True)
    section["host-cgroup"] = {
        "target": args.target,
        "command": command,
        "host": {"python": platform.python_version(), "machine": platform.machine(), "kernel": platform.release(),
                 "note": "a shared 2-core CI machine; PSI in cgroup v1 is machine-wide (other jobs' stalls count)"},
        "model": f"{model} (digits CNN), input {list(shape)} FP32 per request",
        "modes": results,
    }
    doc["memory_squeeze"] = section
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
