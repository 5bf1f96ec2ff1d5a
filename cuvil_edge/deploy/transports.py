"""The table of deploy transports and the one place that opens them.

A device address names its transport (``DeviceAddress.transport``: ``ssh`` by default, ``local`` for
``--to local``); :func:`open_transport` looks it up in :data:`TRANSPORTS` and returns a
:class:`~cuvil_edge.deploy.transport_base.Transport`. Deploy code never names an implementation:
a new transport (an OTA server, a labgrid-managed board) is a class and one entry here.
"""

from __future__ import annotations

from collections.abc import Callable

from cuvil_edge.deploy.local_transport import LocalTransport
from cuvil_edge.deploy.transport import SSHTransport
from cuvil_edge.deploy.transport_base import DeviceAddress, Transport
from cuvil_edge.errors import DeployError

__all__ = ["TRANSPORTS", "open_transport"]

# name -> constructor(address, connect_timeout); the class must satisfy the Transport protocol.
TRANSPORTS: dict[str, Callable[[DeviceAddress, float], Transport]] = {
    "ssh": SSHTransport,
    "local": LocalTransport,
}


def open_transport(address: DeviceAddress, connect_timeout: float = 15.0) -> Transport:
    """The transport for ``address`` (not yet connected: use ``async with``).

    Raises:
        DeployError: the address names a transport no entry of :data:`TRANSPORTS` provides.
    """
    make = TRANSPORTS.get(address.transport)
    if make is None:
        raise DeployError(f"{address.label}: unknown transport '{address.transport}' "
                          f"(known: {', '.join(TRANSPORTS)})")
    return make(address, connect_timeout)
