"""Device-side steps of the Ansible role, run with the device's Python (the daemon's)::

    python -m cuvil_edge.deploy.ondevice probe  --root / --store /var/lib/cuvil-edge < manifest.json
    python -m cuvil_edge.deploy.ondevice health --store /var/lib/cuvil-edge --name digits --version 1.0.0 --load

``probe`` prints the device's facts, whether the bundle fits (same rules as ``cuvil-edge deploy``),
what ``current`` points at, the deploy state and the device's copy of this version's manifest;
exit 1 when the bundle does not fit. ``health`` asks the daemon to load the model (``--load``) and
runs the health gate; prints the verdict as JSON; exit 1 when it fails. Kept out of the package's
``__init__`` so ``python -m`` runs it cleanly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from cuvil_edge.deploy.health import check_health, daemon_load
from cuvil_edge.deploy.probe import IncompatibleDevice, check_compatible, probe_local

__all__ = ["main"]


def _probe(args: argparse.Namespace) -> int:
    from cuvil_edge.bundle import Manifest

    manifest = Manifest.from_bytes(sys.stdin.buffer.read(), "manifest.json (stdin)")
    facts = probe_local(args.root)
    out: dict[str, Any] = {"ok": True, "reason": "", "facts": facts.to_dict(), "notes": []}
    try:
        out["notes"] = check_compatible(manifest, facts, "device")
    except IncompatibleDevice as exc:
        out.update(ok=False, reason=str(exc))
    bdir = os.path.join(args.store, "bundles", manifest.name)
    try:
        out["current"] = os.path.basename(os.readlink(os.path.join(bdir, "current")).rstrip("/"))
    except OSError:
        out["current"] = ""
    try:
        with open(os.path.join(args.store, "deploy", "state", f"{manifest.name}.json")) as f:
            out["state"] = json.load(f)
    except (OSError, ValueError):
        out["state"] = {"name": manifest.name, "previous": None, "versions": {}, "events": []}
    try:
        with open(os.path.join(bdir, manifest.version, "manifest.json")) as f:
            out["manifest"] = f.read()
    except OSError:
        out["manifest"] = None
    print(json.dumps(out))
    return 0 if out["ok"] else 1


def _health(args: argparse.Namespace) -> int:
    base = os.path.join(args.store, "bundles", args.name)
    version = args.version or os.path.basename(os.readlink(os.path.join(base, "current")))
    vdir = os.path.join(base, version)
    with open(os.path.join(vdir, "manifest.json"), "rb") as f:
        manifest = json.loads(f.read())
    val = manifest.get("validation") or {}

    def member(key: str, default: str) -> bytes | None:
        path = os.path.join(vdir, val.get(key, default))
        if not os.path.isfile(path):
            return None
        with open(path, "rb") as f:
            return f.read()

    if args.load:
        err = daemon_load(args.url, args.name, args.timeout, args.token)
        if err:
            print(json.dumps({"ok": False, "reason": err, "version": version}))
            return 1
    result = check_health(args.url, manifest, member("sample_inputs", "sample/inputs.npz"),
                          member("sample_expected", "sample/expected.npz"), args.timeout, args.token)
    out = result.to_dict()
    out["version"] = version
    print(json.dumps(out))
    return 0 if result.ok else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``probe`` or ``health``."""
    p = argparse.ArgumentParser(prog="python -m cuvil_edge.deploy.ondevice", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("probe", help="device facts, bundle fit (manifest on stdin), store state")
    pr.add_argument("--root", default="/")
    pr.add_argument("--store", default="/var/lib/cuvil-edge")
    he = sub.add_parser("health", help="load the model and run the health gate")
    he.add_argument("--store", default="/var/lib/cuvil-edge")
    he.add_argument("--name", required=True)
    he.add_argument("--version", default=None, help="defaults to the version 'current' points at")
    he.add_argument("--url", default="http://127.0.0.1:8000")
    he.add_argument("--timeout", type=float, default=60.0)
    he.add_argument("--token", default=os.environ.get("CUVIL_EDGE_DAEMON_TOKEN"))
    he.add_argument("--load", action="store_true", help="ask the daemon to load the model first")
    args = p.parse_args(argv)
    return _probe(args) if args.cmd == "probe" else _health(args)


if __name__ == "__main__":
    sys.exit(main())
