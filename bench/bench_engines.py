#!/usr/bin/env python3
"""Engine fleet benchmark: builds and bytes for N devices of one key, cached vs. build everywhere.

Devices are loopback Jetson stand-ins (``tests/engines/engine_harness.py``): real OpenSSH ``sshd`` on
127.0.0.1, each with its own root showing an Orin Nano on JetPack 6.2 (L4T 36.4.3, TensorRT
10.3.0), so every device has the key ``l4t-36.4.3_trt-10.3.0_sm8.7_dlanone``. TensorRT is not
installable here: the device build is the STAND-IN builder (``--builder standin``, a fixed
``--standin-seconds`` of simulated build time, 2 s by default, where an Orin's TensorRT build of
a real model takes minutes). So the *counts* (builds, bytes each way) are the result; the times
show the overhead around a build (SSH, probe, upload, sha256, download) plus the stand-in's
fixed build time, not TensorRT's.

In one run, for ``--devices`` N (default 1, 3 and 8), each strategy from an empty host cache and
empty device engine stores:

* ``cuvil-edge``: :func:`cuvil_edge.deploy.engines.ensure_engines` (what ``cuvil-edge engine
  build --on`` runs): the first device builds, the others get the cached engine, sha256-checked;
* peer ``build-everywhere``: every device builds its own, all at once (``rebuild=True``, what you
  get without a host cache keyed by device). Here all devices share this machine's cores, so
  parallel stand-in builds contend; on real boards each builds on its own GPU, but each build
  takes the minutes TensorRT takes, where an upload takes seconds;
* ``present``: the cuvil-edge run again: nothing to build or send.

Usage::

    .venv/bin/python bench/bench_engines.py                    # bench/results/engines.json
    .venv/bin/python bench/bench_engines.py --devices 3 --standin-seconds 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "deploy"))
sys.path.insert(0, str(ROOT / "tests" / "engines"))


def _run(devices: list[Any], source: Any, cache_root: Path, cli: list[str], rebuild: bool) -> dict[str, Any]:
    import asyncio

    from cuvil_edge.bundle.engine_store import EngineStore
    from cuvil_edge.deploy.engines import ensure_engine, ensure_engines
    from cuvil_edge.deploy.transport import run_sync

    kw = {"cache": EngineStore(cache_root), "device_cli": cli, "builder": "standin", "reload": False}
    t0 = time.monotonic()
    if rebuild:
        # The peer: every device builds its own, all at once (no shared lock, no cache use).
        async def everywhere() -> list[Any]:
            return list(await asyncio.gather(*(ensure_engine(d, source, rebuild=True, key_locks={}, **kw)
                                               for d in devices)))

        outcomes = run_sync(everywhere())
    else:
        outcomes = run_sync(ensure_engines(devices, source, **kw))
    wall = time.monotonic() - t0
    bad = [o for o in outcomes if not o.ok]
    if bad:
        raise SystemExit(f"{bad[0].device}: {bad[0].reason}")
    return {"wall_s": round(wall, 2), "builds": sum(o.builds for o in outcomes),
            "bytes_sent": sum(o.bytes_sent for o in outcomes), "bytes_received": sum(o.bytes_received for o in outcomes),
            "statuses": [o.status for o in outcomes], "per_device_s": [round(o.seconds, 2) for o in outcomes]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, nargs="*", default=[1, 3, 8])
    ap.add_argument("--standin-seconds", type=float, default=2.0)
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/engines.json")
    args = ap.parse_args(argv)

    from deploy_harness import fake_board, make_key, start_sshd, write_known_hosts
    from engine_harness import make_engine_bundle

    from cuvil_edge.bundle.signing import generate_keypair
    from cuvil_edge.deploy.engines import BundleEngineSource
    from cuvil_edge.models import build_digits_cnn

    cli = ["env", f"PYTHONPATH={ROOT}", f"CUVIL_EDGE_STANDIN_SECONDS={args.standin_seconds}", sys.executable,
           "-m", "cuvil_edge.cli"]
    result: dict[str, Any] = {
        "what": "engines for N loopback devices of one key (stand-in builder: counts are the result)",
        "command": "python bench/bench_engines.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "standin_build_seconds": args.standin_seconds, "runs": []}
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp:
        work = Path(tmp)
        generate_keypair(work / "sign.key", work / "sign.pub")
        client = work / "client_ed25519"
        make_key(client)
        from cuvil_edge.deploy._asyncssh import asyncssh

        pub = asyncssh.read_private_key(str(client)).export_public_key().decode().strip()
        bundle = make_engine_bundle(work / "digits.cvb", work / "sign.key", "1.0.0", build_digits_cnn())
        source = BundleEngineSource.from_bundle(bundle, work / "sign.pub")
        result["engine_plan_model_bytes"] = len(source.model)
        sshds = []
        try:
            for n in args.devices:
                while len(sshds) < n:
                    dev = start_sshd(work, f"d{len(sshds)}", pub)
                    fake_board(dev.root, "orin-nano-jp62")
                    sshds.append(dev)
                write_known_hosts(work / "known_hosts", sshds)
                devices = [d.address(client, work / "known_hosts") for d in sshds[:n]]
                row: dict[str, Any] = {"devices": n}
                for name, rebuild in (("build_everywhere", True), ("cuvil_edge", False), ("present", False)):
                    if name != "present":
                        for d in sshds[:n]:  # empty device engine stores and host cache
                            import shutil

                            shutil.rmtree(d.store / "engines", ignore_errors=True)
                        shutil.rmtree(work / f"cache-{n}", ignore_errors=True)
                    row[name] = _run(devices, source, work / f"cache-{n}", cli, rebuild)
                    print(f"{n} device(s) {name}: {row[name]}", flush=True)
                result["runs"].append(row)
        finally:
            for d in sshds:
                d.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
