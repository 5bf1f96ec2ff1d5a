"""The one rule for bundle names and versions: each must be a single safe path component.

A bundle's name and version become directories on the device (``bundles/<name>/<version>/``), in
the deploy state and quarantine, and in file names on the host. A signed manifest is not a safe
one: a key holder (or a careless recipe) can write ``../../../../var/escaped``. So every door
applies this rule: the manifest parser (``verify``, ``extract_bundle``, ``read_manifest``), the
packager (``--name``/``--version`` before any work), the daemon's store and its HTTP repository
API, and deploy.

The rule: 1 to 128 characters from ``A-Z a-z 0-9 . _ + -``, starting with a letter or digit (so
never ``.``, ``..`` or a hidden file), not ending in ``.part`` (deploy's upload suffix), and not
one of the names the store layout uses itself (``current``, ``previous``, and ``current.new``, the
swap link of earlier releases; today's swap link starts with a dot, see :mod:`cuvil_edge.bundle.layout`).
"""

from __future__ import annotations

import re

from cuvil_edge.errors import BundleError

__all__ = ["MAX_COMPONENT", "RESERVED_COMPONENTS", "check_bundle_names", "check_component", "is_safe_component"]

MAX_COMPONENT = 128
RESERVED_COMPONENTS = frozenset({"current", "current.new", "previous"})
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")  # 128 characters at most


def is_safe_component(value: object) -> bool:
    """Whether ``value`` is a string that the rule (module docstring) accepts."""
    return (isinstance(value, str) and _SAFE.fullmatch(value) is not None
            and value not in RESERVED_COMPONENTS and not value.endswith(".part"))


def _shown(value: object) -> str:
    text = repr(value) if not isinstance(value, str) else f"'{value}'"
    return text if len(text) <= 70 else f"{text[:60]}...' ({len(value) if isinstance(value, str) else '?'} chars)"


def check_component(kind: str, value: object, error: type[Exception] = BundleError) -> str:
    """Return ``value`` if it is a safe bundle ``kind`` ("name" or "version"); raise ``error`` otherwise.

    Args:
        kind (str): what the value is, for the message ("name", "version").
        value (object): the candidate.
        error (type[Exception]): the exception class to raise. Defaults to BundleError.
    """
    if not is_safe_component(value):
        raise error(
            f"bundle {kind} {_shown(value)} is not a safe directory name: use 1 to {MAX_COMPONENT} letters, "
            "digits, '.', '_', '+' or '-', starting with a letter or digit (not 'current', 'previous' "
            "or '*.part')"
        )
    return value  # type: ignore[return-value]


def check_bundle_names(name: object, version: object, error: type[Exception] = BundleError) -> None:
    """:func:`check_component` on a bundle's name and its version."""
    check_component("name", name, error)
    check_component("version", version, error)
