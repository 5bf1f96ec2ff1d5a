"""``cuvil-edge store install B.cvb --store DIR``: put a bundle into a local store and serve it.

What users did by hand (untar, symlink ``current``, restart the daemon), in the order a power cut
cannot break: the signature and every member are checked while extracting into a temporary
directory beside the version's place, the files and directories are fsynced, the directory is
renamed into place (and its parent fsynced), ``current`` is switched atomically
(:func:`cuvil_edge.bundle.layout.point_current`), and a daemon running on ``--daemon`` is asked to
load the new version over KServe's repository API (``POST /v2/repository/models/{m}/load``), so it
swaps without dropping a request. No daemon listening is not an error: it serves the version at
its next start.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import typer

from cuvil_edge._atomic import fsync_dir, fsync_tree
from cuvil_edge.daemon.store import BundleStore
from cuvil_edge.errors import DaemonError

__all__ = ["install", "notify_daemon", "register"]


def notify_daemon(url: str, name: str, token: str | None = None, timeout: float = 120.0) -> str:
    """Ask the daemon at ``url`` to load ``name``'s current version; what happened, in words.

    Raises:
        DaemonError: the daemon answered with an error (the new version did not load there).
    """
    req = urllib.request.Request(f"{url.rstrip('/')}/v2/repository/models/{name}/load", data=b"", method="POST")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout):
            return f"the daemon at {url} serves it now"
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read() or b"{}").get("error", "")
        except ValueError:
            detail = ""
        raise DaemonError(f"the daemon at {url} refused to load {name!r} ({exc.code}): {detail}"[:600]) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"no daemon answered at {url} ({reason}); it serves this version at its next start"


def install(bundle: Path = typer.Argument(..., help="Bundle file (.cvb)."),
            store: Path = typer.Option(..., "--store", help="Bundle store root (holds bundles/)."),
            pub: Path = typer.Option(None, "--pub", help="Public key the bundle must be signed with."),
            allow_unsigned: bool = typer.Option(False, "--allow-unsigned",
                                                help="Install without checking who signed it (local trials)."),
            daemon: str = typer.Option("http://127.0.0.1:8000", "--daemon",
                                       help="HTTP address of a running cuvil-edged to load it; 'none' to skip."),
            token: str = typer.Option(None, "--token", help="The daemon's bearer token, if it has one."),
            ) -> None:
    """Verify, extract durably, switch current, and have a running daemon load the bundle."""
    from cuvil_edge._console import console

    if not bundle.is_file():
        raise DaemonError(f"{bundle}: no such bundle file")
    if pub is None and not allow_unsigned:
        raise DaemonError(f"{bundle}: pass --pub KEY to check who signed it (or --allow-unsigned)")
    s = BundleStore(store)
    s.check()
    name, version = s.install(bundle, make_current=False, public_key=pub, allow_unsigned=allow_unsigned)
    dest = s.path(name, version)
    fsync_tree(dest)
    fsync_dir(dest.parent)
    s.set_current(name, version)
    said = notify_daemon(daemon, name, token) if daemon.lower() != "none" else "no daemon asked (--daemon none)"
    console.print(f"installed {name} {version} in {store} (current -> {version}); {said}")


def register(app: typer.Typer) -> None:
    store = typer.Typer(name="store", help="The bundle store on this machine.", no_args_is_help=True)
    store.command("install")(install)
    app.add_typer(store, name="store")
