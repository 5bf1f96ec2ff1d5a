"""Fuzz target: a deploy state file's bytes (``deploy/state/<name>.json``) through the checks the
daemon and the device step apply before acting on one (issue 26, finding 7).

Promise: :func:`cuvil_edge.bundle.activation.parse_state` returns a state or raises
``StateFileError``, nothing else; on a state it returns, the deadline rule (``expired_reason``)
and every version name a revert would turn into a path are safe (no exception, no path outside
the store).
"""

from __future__ import annotations

import sys

import atheris
from _harness import main  # the repository first on sys.path

with atheris.instrument_imports(include=["cuvil_edge"]):
    from cuvil_edge.bundle.activation import StateFileError, expired_reason, parse_state
    from cuvil_edge.bundle.layout import StoreLayout

LAYOUT = StoreLayout("/var/lib/cuvil-edge")


def test_one_input(data: bytes) -> None:
    try:
        state = parse_state(data, "m")
    except StateFileError:
        return
    pending = state["pending"]
    if pending is not None:
        expired_reason(pending, now=1.0, this_boot="b")
        for key in ("version", "previous"):
            if pending.get(key):
                assert LAYOUT.version_dir("m", pending[key]).startswith(LAYOUT.bundle_dir("m") + "/")
    if state["previous"]:
        LAYOUT.version_dir("m", state["previous"])
    for version in state["versions"]:
        LAYOUT.version_dir("m", version)


def seeds() -> list[bytes]:
    return [
        b'{"name": "m", "previous": "1.0.0", "versions": {"1.0.0": {"healthy": true}}, "events": [], '
        b'"pending": {"txn": "t", "version": "1.1.0", "previous": "1.0.0", "deadline": 5.0, "boot_id": "b"}, '
        b'"outcome": null}',
        b'{"name": "m", "pending": {"version": "../..", "deadline": 0, "txn": "t"}}',
        b'{"name": "m", "pending": "yes"}',
        b'{"name": "m", "events": 5}',
        b'[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]',
    ]


if __name__ == "__main__":
    main(test_one_input, seeds)
    sys.exit(0)
