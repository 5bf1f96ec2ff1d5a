"""Device-side steps of deploy, run with the device's Python (the daemon's)::

    python -m cuvil_edge.deploy.ondevice activate --store S --name digits --version 1.1.0 --txn T [--wait 130]
    python -m cuvil_edge.deploy.ondevice wait     --store S --name digits --txn T --timeout 30
    python -m cuvil_edge.deploy.ondevice unpack --store S --name digits --version 1.1.0 --sha256 H --manifest-sha256 M
    python -m cuvil_edge.deploy.ondevice revert-expired --store S [--reload cuvil-edged.service]
    python -m cuvil_edge.deploy.ondevice recover --store S [--reload cuvil-edged.service]
    python -m cuvil_edge.deploy.ondevice verify --store S --name digits
    python -m cuvil_edge.deploy.ondevice probe  --root / --store /var/lib/cuvil-edge < manifest.json
    python -m cuvil_edge.deploy.ondevice health --store /var/lib/cuvil-edge --name digits --version 1.0.0 --load

``activate`` takes the device lock and starts the switch/gate/confirm-or-revert transaction
(``deploy/activate.py``) detached from the SSH session (a transient systemd unit where systemd
runs, else a new session with its own log), then, with ``--wait``, prints its outcome as JSON
when it is recorded. ``wait`` prints the outcome of a transaction (the host calls it after a
reconnect). ``unpack`` extracts an upload, fsyncs it, checks every file and renames it into the
store (``deploy/unpack.py``). ``revert-expired`` reverts pending switches past their deadline;
``recover`` does that and quarantines versions whose files fail verification (root runs both:
a transient timer the deploy step sets and the daemon unit's ``ExecStartPre=+``; docs/deploy.md).
``verify`` prints what ``current`` names, whether its files match its manifest and what the state
file says of it (healthy, pending); exit 1 unless it verifies, is healthy and nothing is pending. ``probe`` prints the device's facts, whether the bundle fits,
what ``current`` points at, the deploy state, the device's copy of this version's manifest and
the store paths a deploy of it touches (``paths``, from ``bundle/layout.py``: the Ansible role
names no path itself); exit 1 when the bundle does not fit or its manifest is refused. ``health`` asks the daemon to load the model (``--load``) and
runs the health gate; exit 1 when it fails. Heavy imports wait for the subcommand that needs them,
so ``activate`` and ``wait`` start in a fraction of a second on a small board.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cuvil_edge.bundle.layout import StoreLayout

__all__ = ["main"]

ACK_WAIT_S = 15.0


def _layout(store: str) -> StoreLayout:
    from cuvil_edge.bundle.layout import StoreLayout

    return StoreLayout(store)


def _probe(args: argparse.Namespace) -> int:
    from cuvil_edge.bundle import Manifest
    from cuvil_edge.bundle.activation import current_version, read_state
    from cuvil_edge.deploy.probe import IncompatibleDevice, check_compatible, probe_local
    from cuvil_edge.errors import BundleError

    try:  # the one parser and the one name rule, before any path is named
        manifest = Manifest.from_bytes(sys.stdin.buffer.read(), "manifest.json (stdin)")
    except BundleError as exc:
        print(json.dumps({"ok": False, "reason": str(exc), "notes": []}))
        return 1
    if args.sha256 is not None and not re.fullmatch(r"[0-9a-f]{64}", args.sha256):
        print(json.dumps({"ok": False, "reason": f"--sha256 {args.sha256[:80]!r}: not a sha256 hex digest",
                          "notes": []}))
        return 1
    layout = _layout(args.store)
    facts = probe_local(args.root)
    out: dict[str, Any] = {"ok": True, "reason": "", "facts": facts.to_dict(), "notes": [],
                           "paths": layout.deploy_paths(manifest.name, manifest.version, args.sha256)}
    try:
        out["notes"] = check_compatible(manifest, facts, "device")
    except IncompatibleDevice as exc:
        out.update(ok=False, reason=str(exc))
    out["current"] = current_version(args.store, manifest.name) or ""
    out["state"] = read_state(args.store, manifest.name)
    try:
        with open(layout.manifest_path(manifest.name, manifest.version)) as f:
            out["manifest"] = f.read()
    except OSError:
        out["manifest"] = None
    print(json.dumps(out))
    return 0 if out["ok"] else 1


def _health(args: argparse.Namespace) -> int:
    from cuvil_edge.bundle import Manifest
    from cuvil_edge.bundle.activation import current_version
    from cuvil_edge.deploy.health import check_health, daemon_load, sample_member

    layout = _layout(args.store)
    version = args.version or current_version(args.store, args.name)
    if version is None:
        raise SystemExit(f"{layout.current_link(args.name)}: no current version; pass --version")
    vdir = layout.version_dir(args.name, version)
    manifest = Manifest.load(vdir, complete=False)

    if args.load:
        err = daemon_load(args.url, args.name, args.timeout, args.token)
        if err:
            print(json.dumps({"ok": False, "reason": err, "version": version}))
            return 1
    result = check_health(args.url, manifest, sample_member(vdir, manifest, "sample_inputs"),
                          sample_member(vdir, manifest, "sample_expected"), args.timeout, args.token)
    out = result.to_dict()
    out["version"] = version
    print(json.dumps(out))
    return 0 if result.ok else 1


def _request(args: argparse.Namespace) -> Any:
    from cuvil_edge.bundle.names import is_safe_component
    from cuvil_edge.deploy.activate import ActivateRequest

    for flag, value in (("--name", args.name), ("--version", args.version)):
        if not is_safe_component(value):
            raise SystemExit(f"{flag} {value!r}: not a plain directory name")
    if not re.fullmatch(r"[A-Za-z0-9]{4,64}", args.txn):
        raise SystemExit(f"--txn {args.txn!r}: use 4 to 64 letters and digits")
    return ActivateRequest(store=args.store, name=args.name, version=args.version, txn=args.txn,
                           deadline_s=args.deadline, url=args.url, health_timeout=args.health_timeout,
                           token=args.token, keep=args.keep, sha256=args.sha256, root=args.root,
                           unit=args.unit, by=args.by)


def _activate(args: argparse.Namespace) -> int:
    import time

    from cuvil_edge.deploy import activate as act

    if args.token_stdin:
        args.token = sys.stdin.readline().strip() or None
    req = _request(args)
    if args.health_timeout + act.GATE_MARGIN_S >= args.deadline:
        print(json.dumps({"txn": req.txn, "state": "refused", "outcome": {
            "status": "refused", "reason": f"--health-timeout {args.health_timeout:g} s must end "
            f"{act.GATE_MARGIN_S:g} s before --deadline {args.deadline:g} s"}}))
        return 1
    if args.foreground:  # the detached step as a transient systemd unit
        return act.run_detached(req)
    expires = time.time() + args.deadline + act.LOCK_GRACE_S
    try:
        note = act.take_lock(req.store, req.txn, expires, args.lock_token)
    except act.LockBusy as exc:
        print(json.dumps({"txn": req.txn, "state": "refused",
                          "outcome": {"status": "refused", "reason": str(exc)}}))
        return 1
    try:
        how = act.launch(req, launcher=args.launcher)
    except OSError as exc:
        act.release_lock(req.store, req.txn)
        print(json.dumps({"txn": req.txn, "state": "refused",
                          "outcome": {"status": "failed", "reason": f"could not start the deploy step: {exc}"}}))
        return 1
    # Without --ack-stdin (Ansible reads the answer at once, or fails the host) the outcome counts
    # as seen when printed; with it, only once the caller confirms it read it.
    out = act.wait_outcome(req.store, req.name, req.txn, args.wait, ack=not args.ack_stdin) if args.wait > 0 else \
        {"txn": req.txn, "state": "pending"}
    out["launch"] = how
    if note:
        out["lock_note"] = note
    _answer(args, req.store, req.name, req.txn, out)
    return 0


def _answer(args: argparse.Namespace, store: str, name: str, txn: str, out: dict[str, Any]) -> None:
    """Print the answer; with ``--ack-stdin`` mark the outcome seen only once the caller says it
    read it (a line ``ack`` on stdin): the caller's link may have dropped while we waited, and an
    outcome its host never saw must stay for the next run to adopt."""
    print(json.dumps(out), flush=True)
    if not args.ack_stdin or out.get("state") != "done":
        return
    import select

    ready, _, _ = select.select([sys.stdin], [], [], ACK_WAIT_S)
    if ready and sys.stdin.readline().strip() == "ack":
        from cuvil_edge.deploy.activate import mark_seen

        mark_seen(store, name, txn)


def _wait(args: argparse.Namespace) -> int:
    from cuvil_edge.deploy.activate import wait_outcome

    out = wait_outcome(args.store, args.name, args.txn, args.timeout, ack=not (args.no_ack or args.ack_stdin))
    _answer(args, args.store, args.name, args.txn, out)
    return 0


def _ack(args: argparse.Namespace) -> int:
    from cuvil_edge.deploy.activate import mark_seen

    print(json.dumps({"txn": args.txn, "acknowledged": mark_seen(args.store, args.name, args.txn)}))
    return 0


def _unpack(args: argparse.Namespace) -> int:
    from cuvil_edge._test_hooks import pause
    from cuvil_edge.bundle.names import is_safe_component
    from cuvil_edge.deploy.unpack import unpack_upload
    from cuvil_edge.errors import DeployError

    for flag, value in (("--name", args.name), ("--version", args.version)):
        if not is_safe_component(value):
            raise SystemExit(f"{flag} {value!r}: not a plain directory name")
    for flag, value in (("--sha256", args.sha256), ("--manifest-sha256", args.manifest_sha256)):
        if not re.fullmatch(r"[0-9a-f]{64}", value):
            raise SystemExit(f"{flag} {value[:80]!r}: not a sha256 hex digest")
    try:
        out = unpack_upload(args.store, args.name, args.version, args.sha256, args.manifest_sha256, pause=pause)
    except DeployError as exc:
        print(json.dumps({"ok": False, "reason": str(exc)}))
        return 1
    print(json.dumps({"ok": True, **out}))
    return 0


def _reload(unit: str | None, changed: bool) -> str:
    """Have the daemon's unit re-read the store after a revert (``systemctl reload-or-try-restart``)."""
    if not unit or not changed or not os.path.isdir("/run/systemd/system"):
        return ""
    import subprocess

    out = subprocess.run(["systemctl", "--no-block", "reload-or-try-restart", unit], capture_output=True, text=True,
                         timeout=60)
    return "" if out.returncode == 0 else f"systemctl reload-or-try-restart {unit}: {out.stderr.strip()[:200]}"


def _revert_expired(args: argparse.Namespace) -> int:
    from cuvil_edge.bundle.activation import revert_expired

    done = revert_expired(args.store, by="ondevice revert-expired")
    for d in done:
        print(f"reverted unconfirmed switch of {d.name} {d.version}: {d.reason}", file=sys.stderr)
    err = _reload(args.reload, bool(done))
    if err:
        print(err, file=sys.stderr)
    print(json.dumps([d.__dict__ for d in done]))
    return 0


def _recover(args: argparse.Namespace) -> int:
    from cuvil_edge.bundle.activation import recover_store

    report = recover_store(args.store, by="ondevice recover")
    for line in report.lines():
        print(line, file=sys.stderr)
    err = _reload(args.reload, report.changed)
    if err:
        print(err, file=sys.stderr)
    print(json.dumps(report.to_dict()))
    return 0


def _verify(args: argparse.Namespace) -> int:
    from cuvil_edge.bundle.activation import current_version, read_state, verify_version
    from cuvil_edge.bundle.names import is_safe_component

    if not is_safe_component(args.name):
        raise SystemExit(f"--name {args.name!r}: not a plain directory name")
    version = args.version or current_version(args.store, args.name)
    state = read_state(args.store, args.name)
    why = verify_version(args.store, args.name, version) if version else "no current version"
    healthy = bool(((state.get("versions") or {}).get(version or "") or {}).get("healthy"))
    out = {"name": args.name, "version": version, "files_ok": why is None, "reason": why or "",
           "healthy": healthy, "pending": state.get("pending"), "previous": state.get("previous"),
           "outcome": state.get("outcome"), "notes": state.get("notes") or []}
    print(json.dumps(out))
    return 0 if why is None and healthy and not state.get("pending") else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``activate``, ``wait``, ``ack``, ``unpack``, ``revert-expired``, ``recover``, ``verify``, ``probe`` or ``health``."""
    p = argparse.ArgumentParser(prog="python -m cuvil_edge.deploy.ondevice", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    ac = sub.add_parser("activate", help="switch, health gate, confirm or switch back (detached)")
    ac.add_argument("--store", default="/var/lib/cuvil-edge")
    ac.add_argument("--root", default="/")
    ac.add_argument("--name", required=True)
    ac.add_argument("--version", required=True)
    ac.add_argument("--txn", required=True, help="transaction id chosen by the caller (letters and digits)")
    ac.add_argument("--deadline", type=float, default=120.0, help="seconds the switch may stay unconfirmed")
    ac.add_argument("--url", default="http://127.0.0.1:8000")
    ac.add_argument("--health-timeout", type=float, default=60.0)
    ac.add_argument("--token", default=os.environ.get("CUVIL_EDGE_DAEMON_TOKEN"))
    ac.add_argument("--token-stdin", action="store_true", help="read the daemon token from the first line of stdin")
    ac.add_argument("--keep", type=int, default=3)
    ac.add_argument("--sha256", default=None, help="sha256 of the bundle file (recorded with the install)")
    ac.add_argument("--lock-token", default=None, help="token of the device lock the caller holds (handover)")
    ac.add_argument("--unit", default="cuvil-edged.service", help="daemon unit to restart when it is down")
    ac.add_argument("--by", default="ondevice activate", help="who asked, for the state file's events")
    ac.add_argument("--launcher", choices=("auto", "systemd-run", "setsid"), default="auto")
    ac.add_argument("--wait", type=float, default=0.0, help="seconds to wait for the outcome and print it")
    ac.add_argument("--ack-stdin", action="store_true",
                    help="mark the outcome seen only when the caller writes 'ack' on stdin after reading it")
    ac.add_argument("--foreground", action="store_true", help=argparse.SUPPRESS)
    wa = sub.add_parser("wait", help="print the outcome of a transaction, waiting up to --timeout")
    wa.add_argument("--store", default="/var/lib/cuvil-edge")
    wa.add_argument("--name", required=True)
    wa.add_argument("--txn", required=True)
    wa.add_argument("--timeout", type=float, default=30.0)
    wa.add_argument("--no-ack", action="store_true", help="do not mark the outcome as seen")
    wa.add_argument("--ack-stdin", action="store_true",
                    help="mark the outcome seen only when the caller writes 'ack' on stdin after reading it")
    ak = sub.add_parser("ack", help="mark the outcome of a transaction as seen")
    ak.add_argument("--store", default="/var/lib/cuvil-edge")
    ak.add_argument("--name", required=True)
    ak.add_argument("--txn", required=True)
    un = sub.add_parser("unpack", help="extract an upload, fsync, verify and rename it into the store")
    un.add_argument("--store", default="/var/lib/cuvil-edge")
    un.add_argument("--name", required=True)
    un.add_argument("--version", required=True)
    un.add_argument("--sha256", required=True, help="sha256 of the uploaded .cvb (names the upload)")
    un.add_argument("--manifest-sha256", required=True, help="sha256 of the manifest the host verified")
    rv = sub.add_parser("revert-expired", help="revert pending switches past their deadline")
    rv.add_argument("--store", default="/var/lib/cuvil-edge")
    rv.add_argument("--reload", default=None, metavar="UNIT", help="reload this unit when something was reverted")
    rc = sub.add_parser("recover", help="revert expired switches and quarantine versions that fail verification")
    rc.add_argument("--store", default="/var/lib/cuvil-edge")
    rc.add_argument("--reload", default=None, metavar="UNIT", help="reload this unit when something changed")
    ve = sub.add_parser("verify", help="current version: files against its manifest, state file record")
    ve.add_argument("--store", default="/var/lib/cuvil-edge")
    ve.add_argument("--name", required=True)
    ve.add_argument("--version", default=None, help="defaults to the version 'current' points at")
    pr = sub.add_parser("probe", help="device facts, bundle fit (manifest on stdin), store state")
    pr.add_argument("--root", default="/")
    pr.add_argument("--store", default="/var/lib/cuvil-edge")
    pr.add_argument("--sha256", default=None, help="sha256 of the bundle file: names its upload path in 'paths'")
    he = sub.add_parser("health", help="load the model and run the health gate")
    he.add_argument("--store", default="/var/lib/cuvil-edge")
    he.add_argument("--name", required=True)
    he.add_argument("--version", default=None, help="defaults to the version 'current' points at")
    he.add_argument("--url", default="http://127.0.0.1:8000")
    he.add_argument("--timeout", type=float, default=60.0)
    he.add_argument("--token", default=os.environ.get("CUVIL_EDGE_DAEMON_TOKEN"))
    he.add_argument("--load", action="store_true", help="ask the daemon to load the model first")
    args = p.parse_args(argv)
    run = {"activate": _activate, "wait": _wait, "ack": _ack, "unpack": _unpack, "revert-expired": _revert_expired,
           "recover": _recover, "verify": _verify, "probe": _probe, "health": _health}[args.cmd]
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
