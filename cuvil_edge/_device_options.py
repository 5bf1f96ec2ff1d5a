"""The device options as one group: which devices a command acts on and how to reach them.

``deploy``, ``rollback``, ``status``, ``install-daemon`` and ``engine build --on`` all name devices
the same way (``--to``/``--on``, ``--inventory``, ``--identity``, ``--known-hosts``, ``--root``, ...).
The options are declared once here; :func:`device_options` adds them to a command and hands the
command one :class:`DeviceSelection` instead of eight arguments. ``cuvil_edge.deploy.fleet.select_devices``
turns a selection into device addresses. This module sits in the foundation so that the packager's
``engine build`` and deploy's commands share it without importing each other.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

import typer

__all__ = ["DeviceSelection", "device_options"]

_F = TypeVar("_F", bound=Callable[..., Any])
PANEL = "Devices"


@dataclass(frozen=True)
class DeviceSelection:
    """The devices named on the command line and how to reach them, as one value.

    Args:
        to (tuple[str, ...]): addresses, ``[user@]host[:port]``.
        inventory (Path | None): a TOML inventory of devices.
        identity (Path | None): SSH private key.
        known_hosts (Path | None): known_hosts file.
        no_host_key_check (bool): accept any host key (insecure; labs only).
        root (str | None): the device system root (``/`` on a real board).
        store (str | None): the bundle store on the device.
        daemon_port (int | None): the daemon's port on the device's loopback.
        device_python (str | None): the device's Python that has cuvil-edge.
    """

    to: tuple[str, ...] = ()
    inventory: Path | None = None
    identity: Path | None = None
    known_hosts: Path | None = None
    no_host_key_check: bool = False
    root: str | None = None
    store: str | None = None
    daemon_port: int | None = None
    device_python: str | None = None


# name -> (type, default, flags, help); the names are DeviceSelection's fields.
_OPTIONS: dict[str, tuple[Any, Any, tuple[str, ...], str]] = {
    "to": (list[str], None, ("--to",), "Device as \\[user@]host\\[:port], or local for a store on this machine "
           "(with --root and --store); repeat for several."),
    "inventory": (Path, None, ("--inventory",),
                  "TOML inventory of devices (\\[\\[device]] tables with address = ...)."),
    "identity": (Path, None, ("--identity", "-i"), "SSH private key."),
    "known_hosts": (Path, None, ("--known-hosts",), "known_hosts file. Defaults to ~/.ssh/known_hosts."),
    "no_host_key_check": (bool, False, ("--no-host-key-check",), "Accept any host key (insecure; labs only)."),
    "root": (str, None, ("--root",), "Device system root where facts and units live. Defaults to /."),
    "store": (str, None, ("--store",), "Bundle store on the device. Defaults to <root>/var/lib/cuvil-edge."),
    "daemon_port": (int, None, ("--daemon-port",), "Daemon HTTP port on the device's loopback. Defaults to 8000."),
    "device_python": (str, None, ("--device-python",), "The device's Python that has cuvil-edge (runs the "
                      "device-side step). Defaults to python3."),
}
assert set(_OPTIONS) == {f.name for f in fields(DeviceSelection)}


def device_options(*, leave_out: tuple[str, ...] = (), to_flag: str = "--to",
                   to_help: str | None = None) -> Callable[[_F], _F]:
    """Add the device options to a typer command; the command receives ``devices: DeviceSelection``.

    Args:
        leave_out (tuple[str, ...]): options the command has no use for (``("store", "daemon_port")``).
        to_flag (str): the flag that names devices. Defaults to ``--to`` (``engine build`` uses ``--on``).
        to_help (str | None): its help. Defaults to the ``--to`` help.
    """
    unknown = set(leave_out) - set(_OPTIONS)
    if unknown:
        raise ValueError(f"unknown device options {sorted(unknown)}")
    chosen = [name for name in _OPTIONS if name not in leave_out]

    def decorate(command: _F) -> _F:
        signature = inspect.signature(command)
        hints = typing.get_type_hints(command)
        if "devices" not in signature.parameters:
            raise TypeError(f"{command.__name__} must take a 'devices' parameter (a DeviceSelection)")
        params = [p.replace(annotation=hints.get(p.name, p.annotation))
                  for p in signature.parameters.values() if p.name != "devices"]
        added = {}
        for name in chosen:
            kind, default, flags, help_text = _OPTIONS[name]
            if name == "to":
                flags, help_text = (to_flag,), to_help or help_text
            option = typer.Option(default, *flags, help=help_text, rich_help_panel=PANEL)
            params.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=option,
                                            annotation=kind))
            added[name] = kind

        @functools.wraps(command)
        def run(*args: Any, **kwargs: Any) -> Any:
            values = {name: kwargs.pop(name) for name in chosen}
            values["to"] = tuple(values.get("to") or ())
            return command(*args, devices=DeviceSelection(**values), **kwargs)

        run.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        run.__annotations__ = {**{k: v for k, v in hints.items() if k != "devices"}, **added}
        return typing.cast(_F, run)

    return decorate
