#!/usr/bin/env python3
"""Deploy benchmark: a 20 MB bundle to 1, 5 and 20 loopback devices, and re-deploy when present.

Devices are the ones the deploy tests use (``tests/deploy/deploy_harness.py``): each a real
OpenSSH ``sshd`` on 127.0.0.1 with its own root, and a real ``cuvil-edged`` serving that root's
store, so every deploy runs the whole path: host-side signature and checksum check, SSH
connect, device probe, resumable SFTP upload, sha256 on the device, ``tar`` extraction and
per-file check, atomic switch, repository load, and the health gate (validation sample through
an SSH port forward). The bundle is the digits CNN plus a 20 MB random payload member (the
model itself is 60 kB; the payload stands in for weights/engines).

Measured, each figure the median of ``--rounds`` rounds, all in one run (wall time; for the
cuvil-edge runs also the CPU seconds of this process, the host side, and of the devices: their
sshd sessions with sftp-server, sha256sum and tar, and their daemons):

* ``cuvil-edge`` (``rollout`` with the CLI's defaults except concurrency = number of devices:
  one canary, then the rest at once) fresh install to 1, 5 and 20 devices; the same with no
  canary (all at once); re-deploy of the bundle already present and current (nothing sent).
* peer: the Ansible role of this project (``deploy/ansible``, forks = devices, canary then the
  rest) to 1 and 5 devices, fresh and present.
* floor: ``scp`` of the bundle to N devices at once (transfer only, no check, no switch).

The goal from issue #5 is 20 devices within 3x the time for one. All devices share this machine's
2 cores and loopback, so the fleet figures are CPU-bound here (SSH encryption, sha256, tar,
20 daemons loading a model), where a real fleet is bound by each board's link instead.

Usage::

    .venv/bin/python bench/bench_deploy.py             # bench/results/deploy.json + deploy.png
    .venv/bin/python bench/bench_deploy.py --quick     # 1 round, no Ansible
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "deploy"))

from deploy_harness import (  # noqa: E402
    Daemon,
    SshDevice,
    make_bundle,
    make_key,
    start_sshd,
    write_known_hosts,
)

from cuvil_edge.bundle.signing import generate_keypair  # noqa: E402
from cuvil_edge.deploy.device import DeployOptions, prepare_bundle  # noqa: E402
from cuvil_edge.deploy.fleet import RolloutPolicy, rollout  # noqa: E402
from cuvil_edge.deploy.transport import run_sync  # noqa: E402

SIZES = (1, 5, 20)
SETTLE = 1.0


class Bench:
    def __init__(self, work: Path, n: int) -> None:
        self.work = work
        self.keys = work / "keys"
        generate_keypair(self.keys / "sign.key", self.keys / "sign.pub")
        self.client_pub = make_key(self.keys / "client")
        self.known_hosts = work / "known_hosts"
        self.devices: list[SshDevice] = []
        self.daemons: list[Daemon] = []
        for i in range(n):
            dev = start_sshd(work, f"dev{i:02d}", self.client_pub)
            self.devices.append(dev)
            self.daemons.append(Daemon(dev.store, self.keys / "sign.pub").start())
        write_known_hosts(self.known_hosts, self.devices)
        # The 20 idle daemons tick (watchdog, telemetry): measure that rate and leave it out of
        # the CPU a deploy costs the devices.
        time.sleep(2.0)
        c0, t0 = device_cpu(self), time.perf_counter()
        time.sleep(5.0)
        self.idle_cpu_rate = (device_cpu(self) - c0) / (time.perf_counter() - t0)

    def addresses(self, n: int) -> list[Any]:
        return [d.address(self.keys / "client", self.known_hosts, dm.port)
                for d, dm in zip(self.devices[:n], self.daemons[:n])]

    def wipe(self, n: int) -> None:
        """Back to a device that never had the bundle: unload, remove versions and uploads."""
        for d, dm in zip(self.devices[:n], self.daemons[:n]):
            req = urllib.request.Request(f"http://127.0.0.1:{dm.port}/v2/repository/models/digits/unload",
                                         data=b"{}", method="POST")
            try:
                urllib.request.urlopen(req, timeout=10).close()
            except Exception:  # noqa: BLE001 - not loaded: nothing to unload
                pass
            shutil.rmtree(d.store / "bundles" / "digits", ignore_errors=True)
            shutil.rmtree(d.store / "deploy", ignore_errors=True)
            shutil.rmtree(d.root / "scp", ignore_errors=True)

    def close(self) -> None:
        for dm in self.daemons:
            dm.stop()
        for d in self.devices:
            d.stop()


def _proc_cpu(pid: int, children: bool) -> float:
    """CPU seconds of a process (utime+stime), or of its reaped children (cutime+cstime)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    idx = (13, 14) if children else (11, 12)  # fields after the command: utime=11, stime=12, cutime=13, cstime=14
    return (int(fields[idx[0]]) + int(fields[idx[1]])) / ticks


def device_cpu(bench: Bench) -> float:
    """CPU the loopback devices spent: sshd sessions (sftp-server, sha256sum, tar) and daemons."""
    total = 0.0
    for d, dm in zip(bench.devices, bench.daemons):
        if d.proc is not None:
            total += _proc_cpu(d.proc.pid, children=True)
        if dm.proc is not None:
            total += _proc_cpu(dm.proc.pid, children=False)
    return total


def time_cuvil(bench: Bench, bundle_path: Path, n: int, canary: int) -> tuple[float, dict[str, Any]]:
    dev0 = device_cpu(bench)
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    prepared = prepare_bundle(bundle_path, bench.keys / "sign.pub")  # timed: the CLI does it too
    report = run_sync(rollout(prepared, bench.addresses(n), DeployOptions(health_timeout=120),
                              RolloutPolicy(concurrency=n, canary=canary, batch_size=n, max_fail_share=0.5)))
    dt = time.perf_counter() - t0
    host_cpu = time.process_time() - cpu0
    time.sleep(SETTLE)  # let sshd reap the session processes, so their CPU is counted here
    counts: dict[str, Any] = dict(report.counts())
    if not report.ok:
        raise RuntimeError(f"deploy failed: {[(r.device, r.status, r.reason) for r in report.results]}")
    counts["bytes_sent"] = sum(r.bytes_sent for r in report.results)
    counts["host_cpu_s"] = round(host_cpu, 2)
    idle = bench.idle_cpu_rate * (dt + SETTLE)
    counts["device_cpu_s"] = round(max(0.0, device_cpu(bench) - dev0 - idle), 2)
    return dt, counts


def time_scp(bench: Bench, bundle_path: Path, n: int) -> float:
    procs = []
    t0 = time.perf_counter()
    for d in bench.devices[:n]:
        (d.root / "scp").mkdir(exist_ok=True)
        procs.append(subprocess.Popen(
            ["scp", "-q", "-P", str(d.port), "-i", str(bench.keys / "client"),
             "-o", f"UserKnownHostsFile={bench.known_hosts}", "-o", "StrictHostKeyChecking=yes",
             str(bundle_path), f"root@127.0.0.1:{d.root / 'scp' / 'bundle.cvb'}"]))
    for p in procs:
        if p.wait() != 0:
            raise RuntimeError("scp failed")
    return time.perf_counter() - t0


def time_ansible(bench: Bench, bundle_path: Path, n: int) -> float:
    exe = Path(sys.executable).with_name("ansible-playbook")
    inv = bench.work / f"hosts-{n}.ini"
    lines = ["[devices]"]
    for d, dm in zip(bench.devices[:n], bench.daemons[:n]):
        lines.append(f"{d.name} ansible_host=127.0.0.1 ansible_port={d.port} ansible_user=root "
                     f"ansible_ssh_private_key_file={bench.keys / 'client'} cuvil_edge_root={d.root} "
                     f"cuvil_edge_store={d.store} cuvil_edge_daemon_url=http://127.0.0.1:{dm.port}")
    lines += ["[devices:vars]", f"ansible_python_interpreter={sys.executable}", f"cuvil_edge_python={sys.executable}",
              f"ansible_ssh_common_args='-o UserKnownHostsFile={bench.known_hosts} -o StrictHostKeyChecking=yes'"]
    inv.write_text("\n".join(lines) + "\n")
    env = dict(os.environ, ANSIBLE_PIPELINING="True", ANSIBLE_NOCOLOR="1", ANSIBLE_FORKS=str(max(n, 5)),
               ANSIBLE_LOCAL_TEMP=str(bench.work / "ansible-local"),
               ANSIBLE_REMOTE_TEMP=str(bench.work / "ansible-remote"), ANSIBLE_RETRY_FILES_ENABLED="False",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    cmd = [str(exe), "-i", str(inv), str(ROOT / "cuvil_edge/deploy/ansible/deploy.yml"),
           "-e", f"cuvil_edge_bundle={bundle_path}", "-e", f"cuvil_edge_pub={bench.keys / 'sign.pub'}",
           "-e", f"cuvil_edge_cli={Path(sys.executable).with_name('cuvil-edge')}",
           "-e", "cuvil_edge_health_timeout=120", "-e", '{"cuvil_edge_serial": [1, "100%"]}']
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"ansible-playbook failed:\n{r.stdout[-3000:]}")
    return dt


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="1 round, no Ansible")
    ap.add_argument("--payload-mb", type=float, default=20.0)
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/deploy.json")
    args = ap.parse_args()
    rounds = 1 if args.quick else args.rounds
    work = Path(tempfile.mkdtemp(prefix="bench-deploy-"))
    t_start = time.time()
    print(f"starting {max(SIZES)} devices (sshd + cuvil-edged) ...", flush=True)
    bench = Bench(work, max(SIZES))
    try:
        bundle = make_bundle(work / "bundles/digits-20mb.cvb", bench.keys / "sign.key", "1.0.0",
                             padding=int(args.payload_mb * 1024 * 1024))
        size = bundle.stat().st_size
        print(f"bundle {bundle.name}: {size / 2**20:.1f} MiB", flush=True)
        raw: dict[str, dict[int, list[float]]] = {}
        details: dict[str, dict[int, Any]] = {}

        cpu_raw: dict[str, dict[int, list[dict[str, float]]]] = {}

        def rec(key: str, n: int, dt: float, extra: Any = None) -> None:
            raw.setdefault(key, {}).setdefault(n, []).append(round(dt, 3))
            if extra is not None:
                details.setdefault(key, {})[n] = extra
                cpu_raw.setdefault(key, {}).setdefault(n, []).append(extra)
            print(f"  {key:<22} n={n:<3} {dt:7.2f} s {extra or ''}", flush=True)

        for r in range(rounds):
            print(f"round {r + 1}/{rounds}", flush=True)
            for n in SIZES:
                bench.wipe(n)
                dt, counts = time_cuvil(bench, bundle, n, canary=1)
                rec("cuvil_fresh", n, dt, counts)
                dt, counts = time_cuvil(bench, bundle, n, canary=1)
                rec("cuvil_present", n, dt, counts)
                bench.wipe(n)
                dt, counts = time_cuvil(bench, bundle, n, canary=0)
                rec("cuvil_fresh_no_canary", n, dt, counts)
                bench.wipe(n)
                rec("scp_transfer_only", n, time_scp(bench, bundle, n))
            # Ansible is slow here (about a second a task): one round only.
            if r == 0 and not args.quick and Path(sys.executable).with_name("ansible-playbook").exists():
                for n in (1, 5):
                    bench.wipe(n)
                    rec("ansible_fresh", n, time_ansible(bench, bundle, n))
                    rec("ansible_present", n, time_ansible(bench, bundle, n))
        med = {k: {str(n): median(v) for n, v in by_n.items()} for k, by_n in raw.items()}
        cpu = {k: {str(n): {"host_cpu_s": median([c["host_cpu_s"] for c in cs]),
                            "device_cpu_s": median([c["device_cpu_s"] for c in cs])}
                   for n, cs in by_n.items()} for k, by_n in cpu_raw.items()}
        t1 = med["cuvil_fresh"]["1"]
        t20 = med["cuvil_fresh"]["20"]
        result = {
            "benchmark": "deploy",
            "devices_idle_cpu_per_s": round(bench.idle_cpu_rate, 3),
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                        "load_avg_at_end": os.getloadavg()},
            "bundle": {"bytes": size, "payload_mb": args.payload_mb, "model": "digits CNN + random payload"},
            "rounds": rounds,
            "median_seconds": med,
            "median_cpu_seconds": cpu,
            "raw_seconds": {k: {str(n): v for n, v in by_n.items()} for k, by_n in raw.items()},
            "last_counts": {k: {str(n): v for n, v in by_n.items()} for k, by_n in details.items()},
            "ratio_20_over_1": {
                "cuvil_fresh": round(t20 / t1, 2),
                "cuvil_fresh_no_canary": round(med["cuvil_fresh_no_canary"]["20"] / med["cuvil_fresh_no_canary"]["1"], 2),
                "scp_transfer_only": round(med["scp_transfer_only"]["20"] / med["scp_transfer_only"]["1"], 2),
            },
            "goal": {"text": "20 devices within 3x the time for one (cuvil_fresh)", "met": t20 <= 3 * t1},
            "seconds_total": round(time.time() - t_start, 1),
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({"median_seconds": med, "ratio_20_over_1": result["ratio_20_over_1"],
                          "goal": result["goal"]}, indent=2))
        _plot(med, args.out.with_suffix(".png"))
    finally:
        bench.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _plot(med: dict[str, dict[str, float]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, by_n in med.items():
        ns = sorted(int(n) for n in by_n)
        ax.plot(ns, [by_n[str(n)] for n in ns], marker="o", label=key)
    ax.set_xlabel("devices")
    ax.set_ylabel("seconds (median)")
    ax.set_xticks(list(SIZES))
    ax.set_title("20 MB bundle to N loopback devices (2 shared cores)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
