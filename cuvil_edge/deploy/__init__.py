"""Deploy bundles to devices over SSH: atomic switch, health gate, rollback, fleet rollout.

One device: :func:`deploy_device`, :func:`rollback_device`, :func:`device_status`. Many:
:func:`rollout` (canary, batches, failure share). The CLI commands ``deploy``, ``rollback``,
``status`` and ``install-daemon`` are thin wrappers (``deploy/cli.py``); the Ansible role in
``deploy/ansible/`` does the same steps for teams that run Ansible.
"""

from __future__ import annotations

from cuvil_edge.deploy.device import (
    DeployOptions,
    DeviceResult,
    PreparedBundle,
    deploy_device,
    device_status,
    prepare_bundle,
    rollback_device,
)
from cuvil_edge.deploy.fleet import FleetReport, RolloutPolicy, load_inventory, rollout
from cuvil_edge.deploy.install import InstallResult, install_daemon
from cuvil_edge.deploy.layout import DeviceBusy
from cuvil_edge.deploy.probe import DeviceFacts, IncompatibleDevice, check_compatible, probe_device
from cuvil_edge.deploy.transport import DeviceAddress, SSHTransport, Unreachable, parse_address, run_sync

__all__ = [
    "DeployOptions",
    "DeviceAddress",
    "DeviceBusy",
    "DeviceFacts",
    "DeviceResult",
    "FleetReport",
    "IncompatibleDevice",
    "InstallResult",
    "PreparedBundle",
    "RolloutPolicy",
    "SSHTransport",
    "Unreachable",
    "check_compatible",
    "deploy_device",
    "device_status",
    "install_daemon",
    "load_inventory",
    "parse_address",
    "prepare_bundle",
    "probe_device",
    "rollback_device",
    "rollout",
    "run_sync",
]
