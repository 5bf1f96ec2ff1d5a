#!/usr/bin/env python3
"""Deploy benchmark: a 20 MB bundle to 1, 5 and 20 devices, on bare loopback and on emulated
fleet links (50 Mbit/s, 40 ms RTT), beside ``scp`` and the Ansible role on the same links.

Devices are the ones the deploy tests use (``tests/deploy/deploy_harness.py``): each a real
OpenSSH ``sshd`` on 127.0.0.1 with its own root, and a real ``cuvil-edged`` serving that root's
store, so every deploy runs the whole path: host-side signature and checksum check, SSH
connect, device probe, resumable SFTP upload, sha256 on the device, ``tar`` extraction and
per-file check, then the device-side transaction (pending switch with deadline, atomic switch,
repository load, health gate with the validation sample, confirm). The bundle is the digits CNN
plus a 20 MB random payload member (the model itself is 60 kB; the payload stands in for
weights/engines).

Links: ``bare`` is loopback as is. ``emulated`` puts each device behind its own link, a
user-space TCP proxy in a separate process (``--serve-links``): every byte waits for its turn at
``--rate-mbit`` (one serialization queue per direction, a bottleneck buffer of one
bandwidth-delay product plus 128 KiB) and then for half the RTT. This kernel has no ``netem``;
a proxy gives delay and rate on loopback alone, with nothing to clean up in the network stack.
It does not drop packets: TCP hides loss from a stream proxy.

Measured, each figure the median of ``--rounds`` rounds, all in one run (wall time; for the
cuvil-edge runs also the CPU seconds of this process, the host side, and of the devices: their
sshd sessions with sftp-server, sha256sum, tar and the device-side step, and their daemons):

* ``cuvil-edge`` (``rollout`` with the CLI's defaults except concurrency = number of devices:
  one canary, then the rest at once) fresh install to 1, 5 and 20 devices; the same with no
  canary (all at once); re-deploy of the bundle already present and current (nothing sent).
* peer: the Ansible role of this project (``deploy/ansible``, forks = devices, canary then the
  rest) to 1 and 5 devices, fresh and present, one round.
* floor: ``scp`` of the bundle to N devices at once (transfer only, no check, no switch).

The goal from issue #5 is 20 devices within 3x the time for one, on the emulated links (#11).
All devices share this machine's cores, so 20 devices at once are also CPU-bound here (SSH
encryption, sha256, tar, 20 daemons loading a model), where a real fleet has a CPU per device.

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
LINKS = ("bare", "emulated")


# ------------------------------------------------------------------------------------ link emulator


async def _shaped(src: Any, dst: Any, delay_s: float, rate_bps: float, limit: int) -> None:
    """One direction of a link: serialization at ``rate_bps`` bytes/s, then ``delay_s`` of flight;
    at most ``limit`` bytes queued or in flight (the reader stops, TCP pushes back)."""
    import asyncio
    import collections

    queue: collections.deque[tuple[float, bytes]] = collections.deque()
    inflight = 0
    room = asyncio.Event()
    room.set()
    more = asyncio.Event()
    next_free = 0.0
    loop = asyncio.get_running_loop()
    done = False

    async def reader() -> None:
        nonlocal inflight, next_free, done
        try:
            while True:
                data = await src.read(16384)
                if not data:
                    break
                now = loop.time()
                next_free = max(now, next_free) + len(data) / rate_bps
                queue.append((next_free + delay_s, data))
                inflight += len(data)
                more.set()
                if inflight >= limit:
                    room.clear()
                    await room.wait()
        except (ConnectionError, OSError):
            pass
        finally:
            done = True
            more.set()

    async def writer() -> None:
        nonlocal inflight
        try:
            while True:
                if not queue:
                    if done:
                        break
                    more.clear()
                    await more.wait()
                    continue
                due, data = queue.popleft()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                dst.write(data)
                await dst.drain()
                inflight -= len(data)
                if inflight < limit:
                    room.set()
        except (ConnectionError, OSError):
            pass
        finally:
            dst.close()

    await asyncio.gather(reader(), writer())


async def _serve_links(targets: list[int], rtt_ms: float, rate_mbit: float) -> None:
    import asyncio

    rate = rate_mbit * 1e6 / 8
    delay = rtt_ms / 2000.0
    limit = int(rate * delay) + (128 << 10)
    ports = []
    servers = []
    for target in targets:
        async def handle(r: Any, w: Any, target: int = target) -> None:
            try:
                ur, uw = await asyncio.open_connection("127.0.0.1", target)
            except OSError:
                w.close()
                return
            await asyncio.gather(_shaped(r, uw, delay, rate, limit), _shaped(ur, w, delay, rate, limit))

        srv = await asyncio.start_server(handle, "127.0.0.1", 0)
        servers.append(srv)
        ports.append(srv.sockets[0].getsockname()[1])
    print(json.dumps(ports), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the bench closes stdin


class Links:
    """Emulated links to the devices: the proxy process, and the port in front of each device."""

    def __init__(self, targets: list[int], rtt_ms: float, rate_mbit: float) -> None:
        self.rtt_ms, self.rate_mbit = rtt_ms, rate_mbit
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve-links", json.dumps(targets),
                                      "--rtt-ms", str(rtt_ms), "--rate-mbit", str(rate_mbit)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.ports: list[int] = json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Bench:
    def __init__(self, work: Path, n: int) -> None:
        self.work = work
        self.keys = work / "keys"
        generate_keypair(self.keys / "sign.key", self.keys / "sign.pub")
        self.client_pub = make_key(self.keys / "client")
        self.known_hosts = work / "known_hosts"
        self.devices: list[SshDevice] = []
        self.daemons: list[Daemon] = []
        self.links: Links | None = None
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

    def ssh_ports(self, n: int) -> list[int]:
        """Where the host reaches each device: sshd itself, or the emulated link in front of it."""
        if self.links is None:
            return [d.port for d in self.devices[:n]]
        return self.links.ports[:n]

    def addresses(self, n: int) -> list[Any]:
        import dataclasses

        return [dataclasses.replace(d.address(self.keys / "client", self.known_hosts, dm.port), port=port,
                                    python=sys.executable)
                for d, dm, port in zip(self.devices[:n], self.daemons[:n], self.ssh_ports(n))]

    def use_links(self, links: Links | None) -> None:
        self.links = links
        lines = [f"[127.0.0.1]:{d.port} {d.host_pub}" for d in self.devices]
        if links is not None:
            lines += [f"[127.0.0.1]:{p} {d.host_pub}" for d, p in zip(self.devices, links.ports)]
        self.known_hosts.write_text("\n".join(lines) + "\n")

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
    report = run_sync(rollout(prepared, bench.addresses(n), DeployOptions(health_timeout=120, confirm_deadline=180),
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
    for d, port in zip(bench.devices[:n], bench.ssh_ports(n)):
        (d.root / "scp").mkdir(exist_ok=True)
        procs.append(subprocess.Popen(
            ["scp", "-q", "-P", str(port), "-i", str(bench.keys / "client"),
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
    for d, dm, port in zip(bench.devices[:n], bench.daemons[:n], bench.ssh_ports(n)):
        lines.append(f"{d.name} ansible_host=127.0.0.1 ansible_port={port} ansible_user=root "
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
           "-e", "cuvil_edge_health_timeout=120", "-e", "cuvil_edge_confirm_deadline=180", "-e", '{"cuvil_edge_serial": [1, "100%"]}']
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
    ap.add_argument("--links", default=",".join(LINKS), help="comma-separated: bare, emulated")
    ap.add_argument("--rtt-ms", type=float, default=40.0)
    ap.add_argument("--rate-mbit", type=float, default=50.0)
    ap.add_argument("--no-ansible", action="store_true")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="device counts (a smoke run: 1,2)")
    ap.add_argument("--serve-links", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/deploy.json")
    args = ap.parse_args()
    if args.serve_links is not None:
        import asyncio

        asyncio.run(_serve_links(json.loads(args.serve_links), args.rtt_ms, args.rate_mbit))
        return 0
    links = [x for x in args.links.split(",") if x]
    bad = set(links) - set(LINKS)
    if bad:
        ap.error(f"--links: unknown {', '.join(sorted(bad))}; use {', '.join(LINKS)}")
    rounds = 1 if args.quick else args.rounds
    sizes = [int(x) for x in args.sizes.split(",") if x]
    work = Path(tempfile.mkdtemp(prefix="bench-deploy-"))
    t_start = time.time()
    load_at_start = os.getloadavg()
    print(f"starting {max(sizes)} devices (sshd + cuvil-edged) ...", flush=True)
    bench = Bench(work, max(sizes))
    emulator: Links | None = None
    try:
        bundle = make_bundle(work / "bundles/digits-20mb.cvb", bench.keys / "sign.key", "1.0.0",
                             padding=int(args.payload_mb * 1024 * 1024))
        size = bundle.stat().st_size
        print(f"bundle {bundle.name}: {size / 2**20:.1f} MiB", flush=True)
        raw: dict[str, dict[str, dict[int, list[float]]]] = {}
        details: dict[str, dict[str, dict[int, Any]]] = {}
        cpu_raw: dict[str, dict[str, dict[int, list[dict[str, float]]]]] = {}

        for link in links:
            if link == "emulated":
                emulator = Links([d.port for d in bench.devices], args.rtt_ms, args.rate_mbit)
                bench.use_links(emulator)
            else:
                bench.use_links(None)
            print(f"links: {link}" + (f" ({args.rate_mbit:g} Mbit/s, {args.rtt_ms:g} ms RTT per device)"
                                      if link == "emulated" else " (loopback)"), flush=True)

            def rec(key: str, n: int, dt: float, extra: Any = None, link: str = link) -> None:
                raw.setdefault(link, {}).setdefault(key, {}).setdefault(n, []).append(round(dt, 3))
                if extra is not None:
                    details.setdefault(link, {}).setdefault(key, {})[n] = extra
                    cpu_raw.setdefault(link, {}).setdefault(key, {}).setdefault(n, []).append(extra)
                print(f"  {link:<8} {key:<22} n={n:<3} {dt:7.2f} s {extra or ''}", flush=True)

            for r in range(rounds):
                print(f"round {r + 1}/{rounds}", flush=True)
                for n in sizes:
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
                if (r == 0 and not args.quick and not args.no_ansible
                        and Path(sys.executable).with_name("ansible-playbook").exists()):
                    for n in [x for x in sizes if x <= 5]:
                        bench.wipe(n)
                        rec("ansible_fresh", n, time_ansible(bench, bundle, n))
                        rec("ansible_present", n, time_ansible(bench, bundle, n))
            if emulator is not None:
                emulator.close()
                emulator = None
        med = {lk: {k: {str(n): median(v) for n, v in by_n.items()} for k, by_n in per.items()}
               for lk, per in raw.items()}
        cpu = {lk: {k: {str(n): {"host_cpu_s": median([c["host_cpu_s"] for c in cs]),
                                 "device_cpu_s": median([c["device_cpu_s"] for c in cs])}
                        for n, cs in by_n.items()} for k, by_n in per.items()} for lk, per in cpu_raw.items()}

        top = str(max(sizes))

        def ratio(lk: str, key: str) -> float:
            return round(med[lk][key][top] / med[lk][key]["1"], 2)

        ratios = {lk: {k: ratio(lk, k) for k in ("cuvil_fresh", "cuvil_fresh_no_canary", "scp_transfer_only")}
                  for lk in med}
        goal_link = "emulated" if "emulated" in med else links[0]
        t1, t20 = med[goal_link]["cuvil_fresh"]["1"], med[goal_link]["cuvil_fresh"][top]
        result = {
            "benchmark": "deploy",
            "devices_idle_cpu_per_s": round(bench.idle_cpu_rate, 3),
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                        "load_avg_at_start": load_at_start, "load_avg_at_end": os.getloadavg()},
            "bundle": {"bytes": size, "payload_mb": args.payload_mb, "model": "digits CNN + random payload"},
            "links": {"bare": "loopback", "emulated": {
                "rate_mbit": args.rate_mbit, "rtt_ms": args.rtt_ms, "per_device": True,
                "how": "user-space TCP proxy per device in its own process: serialization at the rate, then "
                       "half the RTT each way; bottleneck buffer one bandwidth-delay product + 128 KiB; no loss"}},
            "rounds": rounds,
            "median_seconds": med,
            "median_cpu_seconds": cpu,
            "cpu_note": "device_cpu_s counts the devices' sshd sessions and daemons; the detached device-side "
                        "step is reparented to init and not counted",
            "raw_seconds": {lk: {k: {str(n): v for n, v in by_n.items()} for k, by_n in per.items()}
                            for lk, per in raw.items()},
            "last_counts": {lk: {k: {str(n): v for n, v in by_n.items()} for k, by_n in per.items()}
                            for lk, per in details.items()},
            "ratio_max_over_1": ratios,
            "sizes": sizes,
            "goal": {"text": f"{top} devices within 3x the time for one (cuvil_fresh, {goal_link} links)",
                     "ratio": round(t20 / t1, 2), "met": t20 <= 3 * t1},
            "seconds_total": round(time.time() - t_start, 1),
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({"median_seconds": med, "ratio_max_over_1": ratios, "goal": result["goal"]}, indent=2))
        _plot(med, args.out.with_suffix(".png"), args)
    finally:
        if emulator is not None:
            emulator.close()
        bench.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _plot(med: dict[str, dict[str, dict[str, float]]], path: Path, args: Any) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, len(med), figsize=(6.5 * len(med), 4), squeeze=False)
    for ax, (link, per) in zip(axes[0], med.items()):
        for key, by_n in per.items():
            ns = sorted(int(n) for n in by_n)
            ax.plot(ns, [by_n[str(n)] for n in ns], marker="o", label=key)
        ax.set_xlabel("devices")
        ax.set_ylabel("seconds (median)")
        ax.set_xticks(sorted({int(n) for by_n in per.values() for n in by_n}))
        title = "loopback" if link == "bare" else f"{args.rate_mbit:g} Mbit/s, {args.rtt_ms:g} ms RTT per device"
        ax.set_title(f"20 MB bundle to N devices: {title}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
