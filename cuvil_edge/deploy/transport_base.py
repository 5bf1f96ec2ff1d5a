"""What deploy needs of a link to a device: the :class:`Transport` protocol (httpx ``_transports/base.py``).

Deploy, rollback, status, engine builds and ``install-daemon`` talk to a device only through this
protocol, so the link is a choice, not a dependency: ``SSHTransport`` (``transport.py``, asyncssh and
SFTP) for boards, ``LocalTransport`` (``local_transport.py``) for a store on this machine, later an
OTA server or a labgrid-managed board. ``transports.TRANSPORTS`` names them; ``open_transport``
picks one by the address's ``transport`` field.

The surface is what the deploy steps use, in four jobs:

* connect: ``async with transport:`` (``connect``/``close``);
* put a file resumably: ``stat``, ``open`` (write at an offset, truncate), ``sha256``, ``rename``
  (``upload.upload_resumable`` builds the resumable upload on them), plus the small file operations
  of the store layout (``makedirs``, ``listdir``, ``readlink``, ``symlink``, ``remove``, ``rmtree``,
  ``read_bytes``, ``write_bytes_atomic``, ``create_exclusive`` for the device lock);
* run the device step: ``run`` (a fixed argument vector, to completion) and ``process`` (a streamed
  one: the ``ondevice`` step's JSON line and acknowledgement, an engine build's log);
* read state: ``read_bytes`` of the store's state files and ``forward_local`` to the daemon's port
  for the health gate.

Errors are :class:`~cuvil_edge.errors.DeployError` naming the device (``Unreachable`` for a lost
link); :meth:`Transport.error` makes one from a low-level exception.
"""

from __future__ import annotations

import os
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from cuvil_edge.errors import DeployError

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["DEFAULT_STORE", "CommandResult", "DeviceAddress", "FileAttrs", "RemoteFile", "RemoteProcess",
           "Transport", "parse_address"]

DEFAULT_STORE = "/var/lib/cuvil-edge"


@dataclass(frozen=True)
class DeviceAddress:
    """Where a device is and how to reach it.

    Args:
        host (str): host name or address.
        port (int): SSH port. Defaults to 22.
        user (str): login user. Defaults to the current user.
        name (str): label in reports. Defaults to ``user@host:port``.
        root (str): device system root: facts (``etc/nv_tegra_release``, ``proc/...``) and the
            systemd unit directory are read below it. ``/`` on a real board. Defaults to ``/``.
        store (str): bundle store root. Defaults to ``<root>/var/lib/cuvil-edge``.
        daemon_port (int): the daemon's HTTP port on the device's loopback. Defaults to 8000.
        identity (str): private key file. Defaults to asyncssh's defaults (``~/.ssh/id_*``).
        known_hosts (str): known_hosts file; ``""`` disables host key checking (insecure).
            Defaults to ``~/.ssh/known_hosts``.
        python (str): the device's Python that has ``cuvil_edge`` (the daemon's); it runs the
            device-side deploy step. Defaults to ``python3``.
        transport (str): how to reach it, a name of ``transports.TRANSPORTS``: ``ssh``, or ``local``
            for a store on this machine (address ``local`` or ``local:NAME``). Defaults to ``ssh``.
    """

    host: str
    port: int = 22
    user: str = ""
    name: str = ""
    root: str = "/"
    store: str = ""
    daemon_port: int = 8000
    identity: str | None = None
    known_hosts: str | None = None
    python: str = "python3"
    transport: str = "ssh"
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def label(self) -> str:
        return self.name or f"{self.user + '@' if self.user else ''}{self.host}:{self.port}"

    @property
    def store_root(self) -> str:
        if self.store:
            return self.store
        return os.path.join(self.root, DEFAULT_STORE.lstrip("/"))

    def sys_path(self, rel: str) -> str:
        """Path of ``rel`` (e.g. ``etc/nv_tegra_release``) under the device's system root."""
        return os.path.join(self.root, rel.lstrip("/"))


def parse_address(text: str, **defaults: Any) -> DeviceAddress:
    """Parse ``[user@]host[:port]`` (IPv6 as ``[addr]:port``), or ``local[:NAME]``, into a :class:`DeviceAddress`.

    Args:
        text (str): the address.
        **defaults: other DeviceAddress fields (root, store, identity, ...).
    """
    user = defaults.pop("user", "") or ""
    port = int(defaults.pop("port", 22) or 22)
    rest = text.strip()
    if not rest:
        raise DeployError("empty device address; use user@host[:port]")
    if rest == "local" or rest.startswith("local:"):
        # A store on this machine (LocalTransport): --root and --store say where.
        name = rest.partition(":")[2] or "local"
        return DeviceAddress(host="localhost", port=0, user=user, **{"name": name, **defaults, "transport": "local"})
    if "@" in rest:
        user, rest = rest.rsplit("@", 1)
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        if tail.startswith(":"):
            port = _port(text, tail[1:])
    elif rest.count(":") == 1:
        host, port_text = rest.split(":")
        port = _port(text, port_text)
    else:
        host = rest
    if not host:
        raise DeployError(f"device address '{text}' has no host; use user@host[:port]")
    return DeviceAddress(host=host, port=port, user=user, **defaults)


def _port(text: str, value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise DeployError(f"device address '{text}': port '{value}' is not a number") from None
    if not 0 < port < 65536:
        raise DeployError(f"device address '{text}': port {port} out of range")
    return port


@dataclass
class CommandResult:
    """A command's exit status and its output, decoded."""

    exit_status: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class FileAttrs:
    """What deploy reads of a device file: its size, whether it is a directory, its modification time."""

    size: int
    is_dir: bool
    mtime: float


class RemoteFile(Protocol):
    """A file opened on the device (``Transport.open``)."""

    async def read(self, size: int = -1, offset: int | None = None) -> bytes: ...

    async def write(self, data: bytes, offset: int | None = None) -> int: ...

    async def truncate(self, size: int) -> None: ...

    async def close(self) -> None: ...


class RemoteProcess(Protocol):
    """A command running on the device (``Transport.process``): text streams, as asyncssh's process.

    ``stdin.write(str)``, ``stdin.write_eof()``, ``await stdout.readline()``, ``async for line in stdout``,
    ``await stderr.read()``; ``exit_status`` and ``exit_signal`` are both None when the link dropped.
    """

    @property
    def stdin(self) -> Any: ...

    @property
    def stdout(self) -> Any: ...

    @property
    def stderr(self) -> Any: ...

    @property
    def exit_status(self) -> int | None: ...

    @property
    def exit_signal(self) -> Any: ...

    async def wait(self, check: bool = False) -> Any: ...

    def close(self) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> Any: ...


@runtime_checkable
class Transport(Protocol):
    """A link to one device; use as ``async with transport:``. See the module docstring."""

    address: DeviceAddress
    sudo: bool  # root's operations go through ``sudo -n`` (a login user that is not root)

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> Any: ...

    async def connect(self) -> None: ...

    async def close(self) -> None: ...

    async def stat(self, path: str) -> FileAttrs | None: ...

    async def exists(self, path: str) -> bool: ...

    async def makedirs(self, path: str) -> None: ...

    async def listdir(self, path: str) -> list[str]: ...

    async def readlink(self, path: str) -> str | None: ...

    async def read_bytes(self, path: str, limit: int = 64 << 20) -> bytes | None: ...

    async def write_bytes_atomic(self, path: str, data: bytes) -> None: ...

    async def create_exclusive(self, path: str, data: bytes) -> bool: ...

    async def symlink(self, target: str, link: str) -> None: ...

    async def rename(self, src: str, dst: str) -> None: ...

    async def remove(self, path: str) -> None: ...

    async def rmtree(self, path: str) -> None: ...

    async def open(self, path: str, mode: str) -> RemoteFile: ...

    async def run(self, argv: list[str], timeout: float = 600.0, input: str | None = None  # noqa: A002
                  ) -> CommandResult: ...

    async def process(self, argv: list[str], merge_stderr: bool = False) -> RemoteProcess: ...

    async def sha256(self, path: str) -> str: ...

    def forward_local(self, remote_port: int, remote_host: str = "127.0.0.1"
                      ) -> AbstractAsyncContextManager[int]: ...

    def error(self, op: str, path: str, exc: BaseException) -> DeployError: ...
