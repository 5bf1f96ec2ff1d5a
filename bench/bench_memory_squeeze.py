#!/usr/bin/env python3
"""Memory squeeze on a real kernel: cuvil-edged under tritonclient load while stress-ng hogs memory
and CPU beside it, with the memory co-scheduler reading the kernel (on) or blind to it (off).

Targets:

* ``host-cgroup`` (runs here, as root): the "board" is a memory cgroup on this machine whose
  limit is the daemon's measured footprint plus ``--headroom-mb``; the daemon and the hog run
  inside it, so the kernel's memcg OOM killer and reclaim act exactly as on a board with that much
  RAM. On: the daemon reads its cgroup (limit, usage, OOM kills), ``/proc/meminfo`` and PSI
  (``KernelMemory``). Off: ``CUVIL_EDGED_KERNEL_MEMORY=0`` and no telemetry, so its ladder never
  sees the squeeze (what a daemon without the co-scheduler does).
* ``qemu-system``: the emulated arm64 board of the HIL rig (``hil.board.boot``, 2 GB RAM, the
  daemon under systemd). Not run in this session (the rig's board was not merged yet): the
  command exits with a message saying so when ``hil.board`` is not importable.

Timeline per mode: ``--baseline`` s of load alone, then ``stress-ng --vm 1 --vm-bytes
<headroom x --hog-factor> --vm-keep`` plus ``stress-ng --cpu 1`` for ``--squeeze`` s, then
``--recovery`` s of load alone. Measured: daemon OOM kills (the daemon process ended by SIGKILL)
and OOM kills in the cgroup, requests served, 503s and whether they carried ``Retry-After``, p50 and
p99 of served requests per phase, and the recovery time: from the hog's exit until a one-second
window serves at least 90% of the baseline rate with no 503. Results go to the ``memory_squeeze``
section of ``bench/results/memory_squeeze.json`` with the command that produced them.

Usage::

    sudo .venv/bin/python bench/bench_memory_squeeze.py --target host-cgroup
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
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
        import shlex

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
                except Exception:
                    kind = "error"
                    time.sleep(0.2)  # the daemon is down: do not spin
                with self._lock:
                    self.records.append((time.monotonic(), kind, (time.monotonic() - t0) * 1000))
                if kind == "503":
                    time.sleep(0.05)
        finally:
            client.close()

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", choices=["host-cgroup", "qemu-system"], default="host-cgroup")
    ap.add_argument("--modes", default="off,on")
    ap.add_argument("--threads", type=int, default=4, help="tritonclient load threads")
    ap.add_argument("--baseline", type=float, default=15.0)
    ap.add_argument("--squeeze", type=float, default=20.0)
    ap.add_argument("--recovery", type=float, default=15.0)
    ap.add_argument("--headroom-mb", type=int, default=256, help="cgroup limit = daemon footprint + this")
    ap.add_argument("--hog-factor", type=float, default=1.25, help="hog size as a multiple of the headroom")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "memory_squeeze.json")
    args = ap.parse_args(argv)
    if args.target == "qemu-system":
        try:
            import hil.board  # noqa: F401
        except ImportError:
            print("bench_memory_squeeze: the HIL rig's emulated board (hil.board.boot) is not in this checkout; "
                  "the qemu-system target was not run", file=sys.stderr)
            return 2
        print("bench_memory_squeeze: the qemu-system target is not implemented yet in this bench", file=sys.stderr)
        return 2
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
    doc: dict[str, Any] = {}
    if args.out.exists():
        doc = json.loads(args.out.read_text())
    doc["memory_squeeze"] = {
        "target": args.target,
        "command": "python bench/bench_memory_squeeze.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "host": {"python": platform.python_version(), "machine": platform.machine(), "kernel": platform.release(),
                 "note": "a shared 2-core CI machine; PSI in cgroup v1 is machine-wide (other jobs' stalls count)"},
        "model": f"{model} (digits CNN), input {list(shape)} FP32 per request",
        "modes": results,
        "qemu_system": "not run: the HIL rig's emulated board was not available in this session",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
