"""Deploy bundles to devices: atomic switch, health gate, rollback, fleet rollout.

Devices are reached through a :class:`Transport` (``transport_base.py``): SSH for boards, a local
store on this machine; :data:`TRANSPORTS` names them and :func:`open_transport` picks one per address.

One device: :func:`deploy_device`, :func:`rollback_device`, :func:`device_status`. Many:
:func:`rollout` (canary, batches, failure share). The CLI commands ``deploy``, ``rollback``,
``status`` and ``install-daemon`` are thin wrappers (``deploy/cli.py``); the Ansible role in
``deploy/ansible/`` does the same steps for teams that run Ansible.
"""

from __future__ import annotations

import importlib
from typing import Any

# Names resolve on first use (PEP 562): ``python -m cuvil_edge.deploy.ondevice`` on a device then
# starts without importing asyncssh and the host side (0.9 s here, more on a small board).
_WHERE = {
    "DeployOptions": "device", "DeviceResult": "device", "PreparedBundle": "device", "deploy_device": "device",
    "device_status": "device", "prepare_bundle": "device", "rollback_device": "device",
    "FleetReport": "fleet", "RolloutPolicy": "fleet", "load_inventory": "fleet", "rollout": "fleet",
    "select_devices": "fleet", "LocalTransport": "local_transport", "Transport": "transport_base",
    "TRANSPORTS": "transports", "open_transport": "transports",
    "InstallResult": "install", "install_daemon": "install", "DeviceBusy": "layout",
    "DeviceFacts": "probe", "IncompatibleDevice": "probe", "check_compatible": "probe", "probe_device": "probe",
    "DeviceAddress": "transport", "SSHTransport": "transport", "Unreachable": "transport",
    "parse_address": "transport", "run_sync": "transport",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'cuvil_edge.deploy' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"cuvil_edge.deploy.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "TRANSPORTS",
    "DeployOptions",
    "DeviceAddress",
    "DeviceBusy",
    "DeviceFacts",
    "DeviceResult",
    "FleetReport",
    "IncompatibleDevice",
    "InstallResult",
    "LocalTransport",
    "PreparedBundle",
    "RolloutPolicy",
    "SSHTransport",
    "Transport",
    "Unreachable",
    "check_compatible",
    "deploy_device",
    "device_status",
    "install_daemon",
    "load_inventory",
    "open_transport",
    "parse_address",
    "prepare_bundle",
    "probe_device",
    "rollback_device",
    "rollout",
    "run_sync",
    "select_devices",
]
