"""SSH transport to one device: asyncssh connection, SFTP file operations, fixed remote commands.

Nothing here builds a shell string from user input. File work goes through SFTP (stat, mkdir,
symlink, ``posix-rename@openssh.com``); the few commands that must run on the device
(``sha256sum``, ``tar``, ``uname``, ``dpkg-query``, ``systemctl``) are fixed argument vectors
joined with :func:`shlex.join`, so every path is quoted.

Errors from asyncssh and the network are translated at this boundary into
:class:`~cuvil_edge.errors.DeployError` carrying the device address.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
from collections.abc import AsyncIterator, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import asyncssh

from cuvil_edge.errors import DeployError

__all__ = ["DeviceAddress", "SSHTransport", "Unreachable", "parse_address", "run_sync"]

DEFAULT_STORE = "/var/lib/cuvil-edge"
# AES-GCM first: asyncssh builds a new ChaCha20 context per packet, AES-GCM runs in one OpenSSL
# context (30% faster uploads here); Jetson CPUs have the ARMv8 AES instructions.
_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "chacha20-poly1305@openssh.com",
            "aes128-ctr", "aes256-ctr")


class Unreachable(DeployError):
    """The device could not be reached or the SSH session failed (network, auth, host key)."""


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
    """Parse ``[user@]host[:port]`` (IPv6 as ``[addr]:port``) into a :class:`DeviceAddress`.

    Args:
        text (str): the address.
        **defaults: other DeviceAddress fields (root, store, identity, ...).
    """
    user = defaults.pop("user", "") or ""
    port = int(defaults.pop("port", 22) or 22)
    rest = text.strip()
    if not rest:
        raise DeployError("empty device address; use user@host[:port]")
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
    exit_status: int
    stdout: str
    stderr: str


class SSHTransport:
    """One SSH connection to a device with an SFTP session; use as an async context manager."""

    def __init__(self, address: DeviceAddress, connect_timeout: float = 15.0) -> None:
        self.address = address
        self.connect_timeout = connect_timeout
        self.conn: asyncssh.SSHClientConnection | None = None
        self.sftp: asyncssh.SFTPClient | None = None

    async def __aenter__(self) -> SSHTransport:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> None:
        a = self.address
        known: Any = ()
        if a.known_hosts is None:
            known = os.path.expanduser("~/.ssh/known_hosts")
            if not os.path.exists(known):
                raise Unreachable(
                    f"{a.label}: no known_hosts file at {known}; pass --known-hosts FILE "
                    "(or --no-host-key-check, insecure)"
                )
        elif a.known_hosts == "":
            known = None
        else:
            known = a.known_hosts
        options: dict[str, Any] = {
            "port": a.port,
            "encryption_algs": _CIPHERS,
            "known_hosts": known,
            "connect_timeout": self.connect_timeout,
            "keepalive_interval": 15,
            "keepalive_count_max": 3,
        }
        if a.user:
            options["username"] = a.user
        if a.identity:
            options["client_keys"] = [a.identity]
        try:
            self.conn = await asyncssh.connect(a.host, **options)
            try:
                self.sftp = await self.conn.start_sftp_client()
            except BaseException:
                await self.close()  # no half-open connection left for the garbage collector
                raise
        except asyncssh.HostKeyNotVerifiable as exc:
            raise Unreachable(f"{a.label}: host key not verifiable ({exc.reason}); check known_hosts") from exc
        except asyncssh.PermissionDenied as exc:
            raise Unreachable(f"{a.label}: permission denied; check --identity and authorized_keys") from exc
        except (OSError, asyncio.TimeoutError, asyncssh.Error) as exc:
            raise Unreachable(f"{a.label}: cannot connect: {_reason(exc)}") from exc

    async def close(self) -> None:
        if self.sftp is not None:
            self.sftp.exit()
            self.sftp = None
        if self.conn is not None:
            self.conn.close()
            with contextlib.suppress(Exception):
                await self.conn.wait_closed()
            self.conn = None

    # -- SFTP helpers ------------------------------------------------------------------------

    @property
    def _sftp(self) -> asyncssh.SFTPClient:
        if self.sftp is None:
            raise Unreachable(f"{self.address.label}: not connected")
        return self.sftp

    async def stat(self, path: str) -> asyncssh.SFTPAttrs | None:
        """``lstat`` of ``path``, or None when it does not exist."""
        try:
            return await self._sftp.lstat(path)
        except asyncssh.SFTPNoSuchFile:
            return None
        except (OSError, asyncssh.Error) as exc:
            raise self._error("stat", path, exc) from exc

    async def exists(self, path: str) -> bool:
        return (await self.stat(path)) is not None

    async def makedirs(self, path: str) -> None:
        try:
            await self._sftp.makedirs(path, exist_ok=True)
        except (OSError, asyncssh.Error) as exc:
            raise self._error("mkdir", path, exc) from exc

    async def listdir(self, path: str) -> list[str]:
        try:
            names = await self._sftp.listdir(path)
        except asyncssh.SFTPNoSuchFile:
            return []
        except (OSError, asyncssh.Error) as exc:
            raise self._error("list", path, exc) from exc
        return sorted(n for n in names if n not in (".", ".."))

    async def readlink(self, path: str) -> str | None:
        try:
            return await self._sftp.readlink(path)
        except (asyncssh.SFTPNoSuchFile, asyncssh.SFTPFailure, asyncssh.SFTPInvalidParameter):
            return None
        except (OSError, asyncssh.Error) as exc:
            raise self._error("readlink", path, exc) from exc

    async def read_bytes(self, path: str, limit: int = 64 << 20) -> bytes | None:
        """Contents of a remote file, or None when it does not exist."""
        try:
            async with self._sftp.open(path, "rb") as f:
                data = await f.read(limit)
        except asyncssh.SFTPNoSuchFile:
            return None
        except (OSError, asyncssh.Error) as exc:
            raise self._error("read", path, exc) from exc
        return bytes(data)

    async def write_bytes_atomic(self, path: str, data: bytes) -> None:
        """Write ``path`` through a temp file and a posix rename: readers see old or new, never half."""
        tmp = f"{path}.tmp-{os.getpid()}"
        try:
            async with self._sftp.open(tmp, "wb") as f:
                await f.write(data)
            await self._sftp.posix_rename(tmp, path)
        except (OSError, asyncssh.Error) as exc:
            with contextlib.suppress(Exception):
                await self._sftp.remove(tmp)
            raise self._error("write", path, exc) from exc

    async def symlink(self, target: str, link: str) -> None:
        try:
            await self._sftp.symlink(target, link)
        except (OSError, asyncssh.Error) as exc:
            raise self._error("symlink", link, exc) from exc

    async def rename(self, src: str, dst: str) -> None:
        """Atomic rename replacing ``dst`` (``posix-rename@openssh.com``)."""
        try:
            await self._sftp.posix_rename(src, dst)
        except (OSError, asyncssh.Error) as exc:
            raise self._error("rename", f"{src} -> {dst}", exc) from exc

    async def remove(self, path: str) -> None:
        try:
            await self._sftp.remove(path)
        except asyncssh.SFTPNoSuchFile:
            return
        except (OSError, asyncssh.Error) as exc:
            raise self._error("remove", path, exc) from exc

    async def rmtree(self, path: str) -> None:
        try:
            await self._sftp.rmtree(path, ignore_errors=False)
        except asyncssh.SFTPNoSuchFile:
            return
        except (OSError, asyncssh.Error) as exc:
            raise self._error("remove", path, exc) from exc

    async def open(self, path: str, mode: str) -> asyncssh.SFTPClientFile:
        try:
            return await self._sftp.open(path, mode)
        except (OSError, asyncssh.Error) as exc:
            raise self._error("open", path, exc) from exc

    # -- commands ------------------------------------------------------------------------------

    async def run(self, argv: list[str], timeout: float = 600.0, input: str | None = None) -> CommandResult:  # noqa: A002
        """Run a fixed argument vector on the device (each argument quoted); never raises on exit.

        ``input`` goes to the command's stdin (secrets travel there, not in argv).
        """
        if self.conn is None:
            raise Unreachable(f"{self.address.label}: not connected")
        try:
            res = await self.conn.run(shlex.join(argv), check=False, timeout=timeout, input=input)
        except (OSError, asyncssh.Error, asyncio.TimeoutError) as exc:
            raise self._error("run", argv[0], exc) from exc
        if res.exit_status is None and res.exit_signal is None:
            # The channel closed with neither an exit status nor a signal: the link dropped.
            raise Unreachable(f"{self.address.label}: run {argv[0]}: the connection closed before the command ended")
        return CommandResult(
            exit_status=res.exit_status if res.exit_status is not None else -1,
            stdout=str(res.stdout or ""),
            stderr=str(res.stderr or ""),
        )

    async def sha256(self, path: str) -> str:
        """sha256 of a file, computed on the device."""
        res = await self.run(["sha256sum", "--", path])
        if res.exit_status != 0:
            raise DeployError(f"{self.address.label}: sha256sum {path} failed: {res.stderr.strip()}")
        return res.stdout.split()[0]

    @contextlib.asynccontextmanager
    async def forward_local(self, remote_port: int, remote_host: str = "127.0.0.1") -> AsyncIterator[int]:
        """Forward a loopback port on this host to ``remote_host:remote_port`` seen from the device.

        Yields the local port. On exit the listener is closed and waited for: a forward still
        closing when the event loop ends leaves its sockets to the garbage collector.
        """
        if self.conn is None:
            raise Unreachable(f"{self.address.label}: not connected")
        try:
            listener = await self.conn.forward_local_port("127.0.0.1", 0, remote_host, remote_port)
        except (OSError, asyncssh.Error) as exc:
            raise self._error("forward port", str(remote_port), exc) from exc
        try:
            yield listener.get_port()
        finally:
            listener.close()
            with contextlib.suppress(Exception):
                await listener.wait_closed()

    def _error(self, op: str, path: str, exc: BaseException) -> DeployError:
        cls = Unreachable if isinstance(exc, (asyncssh.ConnectionLost, asyncssh.DisconnectError,
                                               ConnectionError, BrokenPipeError)) else DeployError
        return cls(f"{self.address.label}: {op} {path}: {_reason(exc)}")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, asyncssh.SFTPError):
        return exc.reason or type(exc).__name__
    if isinstance(exc, asyncssh.DisconnectError):
        return exc.reason or type(exc).__name__
    text = str(exc).strip()
    return text or type(exc).__name__


_T = TypeVar("_T")


def _quiet_lost_connections(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    # asyncssh leaves its parallel SFTP write tasks unretrieved when a link dies mid-upload;
    # the upload itself reports the failure, so these duplicates are dropped.
    exc = context.get("exception")
    if isinstance(exc, (asyncssh.ConnectionLost, asyncssh.SFTPConnectionLost, asyncssh.SFTPNoConnection,
                        asyncssh.DisconnectError, ConnectionError, BrokenPipeError)):
        return
    loop.default_exception_handler(context)


class _DropRepeatedSendWarnings(logging.Filter):
    """asyncio logs ``socket.send() raised exception.`` for every write to a connection that is
    already lost (dozens per dead SSH link); the transport reports the lost link once itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("socket.send() raised exception")


_SEND_FILTER = _DropRepeatedSendWarnings()


@contextlib.contextmanager
def quiet_link_logs() -> Iterator[None]:
    """Silence the per-packet noise of dead links while deploy runs: asyncio's repeated send
    warnings and asyncssh's connection log (its INFO lines would print one per channel)."""
    aio = logging.getLogger("asyncio")
    ssh = logging.getLogger("asyncssh")
    level = ssh.level
    aio.addFilter(_SEND_FILTER)
    ssh.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        aio.removeFilter(_SEND_FILTER)
        ssh.setLevel(level)


def run_sync(coro: Coroutine[Any, Any, _T], threads: int = 64) -> _T:
    """Run a deploy coroutine to completion on a fresh event loop.

    Health checks run in threads (blocking HTTP through the SSH forward), one per device in
    flight, so the default executor is sized for a fleet rather than for the CPU count.
    """

    async def main() -> _T:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(_quiet_lost_connections)
        loop.set_default_executor(ThreadPoolExecutor(max_workers=threads, thread_name_prefix="cuvil-deploy"))
        return await coro

    with quiet_link_logs():
        return asyncio.run(main())
