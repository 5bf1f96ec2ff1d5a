"""HIL targets as data: ``hil/targets.toml`` loaded and checked, one :class:`HilTarget` each.

A new board is a new table in the file, not code. Every field is checked here, so a typo is a
one-line error naming the file, the target and the field, before anything boots.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuvil_edge._toml import TOMLDecodeError, load_toml
from hil.errors import TargetError

__all__ = ["KINDS", "TARGETS_FILE", "HilTarget", "get_hil_target", "load_hil_targets"]

TARGETS_FILE = Path(__file__).resolve().parent / "targets.toml"
KINDS = ("local", "qemu-user", "qemu-system", "ssh")

# field -> (type, kinds that accept it)
_FIELDS: dict[str, tuple[type | tuple[type, ...], tuple[str, ...]]] = {
    "kind": (str, KINDS),
    "description": (str, KINDS),
    "cpus": (list, ("qemu-user",)),
    "cpu": (str, ("qemu-system",)),
    "smp": (int, ("qemu-system",)),
    "mem_mb": (int, ("qemu-system",)),
    "boot_timeout": ((int, float), ("qemu-system",)),
    "board": (str, ("qemu-system", "ssh")),
    "host": (str, ("ssh",)),
    "port": (int, ("ssh",)),
    "user": (str, ("ssh",)),
    "key": (str, ("ssh",)),
    "known_hosts": (str, ("ssh",)),
    "fallback": (str, ("ssh",)),
    "connect_timeout": ((int, float), ("ssh",)),
}


@dataclass(frozen=True)
class HilTarget:
    """One target of the rig.

    Args:
        name (str): the table name (``qemu-system``).
        kind (str): ``local``, ``qemu-user``, ``qemu-system`` or ``ssh``.
        board (str | None): board profile (``cuvil-edge targets``): the personality of a
            ``qemu-system`` target, the profile an ``ssh`` board must report. Defaults to None.
        fallback (str | None): the target an unreachable ``ssh`` board falls back to.
    """

    name: str
    kind: str
    description: str = ""
    cpus: tuple[str, ...] = ()
    cpu: str = "cortex-a76"
    smp: int = 2
    mem_mb: int = 2048
    boot_timeout: float = 420.0
    board: str | None = None
    host: str = ""
    port: int = 22
    user: str = "root"
    key: str | None = None
    known_hosts: str | None = None
    fallback: str | None = None
    connect_timeout: float = 10.0
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def key_path(self) -> Path | None:
        return Path(os.path.expanduser(self.key)) if self.key else None


def load_hil_targets(path: Path | None = None) -> dict[str, HilTarget]:
    """All targets of ``path``, checked.

    Args:
        path (Path | None): a targets file. Defaults to ``$CUVIL_HIL_TARGETS``, then ``hil/targets.toml``.

    Raises:
        TargetError: unreadable file, unknown kind or field, wrong type, missing ``host``.
    """
    path = Path(path or os.environ.get("CUVIL_HIL_TARGETS") or TARGETS_FILE)
    try:
        data = load_toml(path)
    except OSError as exc:
        raise TargetError(f"{path}: cannot read it ({exc.strerror})") from None
    except TOMLDecodeError as exc:
        raise TargetError(f"{path}: not valid TOML ({exc})") from None
    tables = data.get("target")
    if not isinstance(tables, dict) or not tables:
        raise TargetError(f"{path}: no [target.NAME] tables")
    targets: dict[str, HilTarget] = {}
    for name, table in tables.items():
        where = f"{path}: target.{name}"
        if not isinstance(table, dict):
            raise TargetError(f"{where}: must be a table")
        kind = table.get("kind")
        if kind not in KINDS:
            raise TargetError(f"{where}.kind: {kind!r} is not one of {', '.join(KINDS)}")
        for key, value in table.items():
            if key not in _FIELDS:
                raise TargetError(f"{where}.{key}: unknown field")
            typ, kinds = _FIELDS[key]
            if kind not in kinds:
                raise TargetError(f"{where}.{key}: not a field of kind '{kind}'")
            if not isinstance(value, typ) or isinstance(value, bool):
                raise TargetError(f"{where}.{key}: {value!r} has the wrong type")
        if kind == "ssh" and not table.get("host"):
            raise TargetError(f"{where}.host: an ssh target needs the board's address")
        if "board" in table:
            from cuvil_edge.errors import TargetError as ProfileError
            from cuvil_edge.targets import get_target

            try:
                get_target(table["board"])
            except ProfileError as exc:
                raise TargetError(f"{where}.board: {exc}") from None
        values = dict(table)
        if "cpus" in values:
            values["cpus"] = tuple(values["cpus"])
        targets[name] = HilTarget(name=name, **values)
    for t in targets.values():
        if t.fallback is not None and targets.get(t.fallback, None) is None:
            raise TargetError(f"{path}: target.{t.name}.fallback: no target named '{t.fallback}'")
        if t.fallback is not None and targets[t.fallback].kind != "qemu-system":
            raise TargetError(f"{path}: target.{t.name}.fallback: '{t.fallback}' is not a qemu-system target")
    return targets


def get_hil_target(name: str, path: Path | None = None) -> HilTarget:
    """The target called ``name``; :class:`TargetError` lists the known ones otherwise."""
    targets = load_hil_targets(path)
    if name not in targets:
        raise TargetError(f"unknown HIL target '{name}'; known: {', '.join(sorted(targets))}")
    return targets[name]
