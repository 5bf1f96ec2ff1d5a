"""SSH transport to one device: asyncssh connection, SFTP file operations, fixed remote commands.

:class:`SSHTransport` implements :class:`~cuvil_edge.deploy.transport_base.Transport`, the one
interface deploy uses; ``transports.open_transport`` picks it for ``ssh`` addresses.

Nothing here builds a shell string from user input. File work goes through SFTP (stat, mkdir,
symlink, ``posix-rename@openssh.com``); the few commands that must run on the device
(``sha256sum``, ``tar``, ``uname``, ``dpkg-query``, ``systemctl``) are fixed argument vectors
joined with :func:`shlex.join`, so every path is quoted.

Errors from asyncssh and the network are translated at this boundary into
:class:`~cuvil_edge.errors.DeployError` carrying the device address.

A stock JetPack board logs in as a normal user with sudo, never as root, while the store
(``/var/lib/cuvil-edge``), the units and ``systemctl`` are root's. So when the login user is not
root and ``sudo -n true`` succeeds, the transport works as root through sudo: every command runs
as ``sudo -n -- ARGV`` and the SFTP session is the board's own ``sftp-server`` started through
``sudo -n`` on a plain channel (what ``sudo sftp`` clients do), so file operations are root's too
and the files the host writes are root's, as over a root login. ``sudo`` then tells whether that
happened; a user whose sudo needs a password stays unprivileged (``sudo_refused`` keeps sudo's
words) and a refused root operation names the reason in one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
from collections.abc import AsyncIterator, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from cuvil_edge.deploy._asyncssh import asyncssh
from cuvil_edge.deploy.transport_base import (
    DEFAULT_STORE,
    CommandResult,
    DeviceAddress,
    FileAttrs,
    parse_address,
)
from cuvil_edge.errors import DeployError

# DeviceAddress, parse_address and CommandResult live in transport_base (every transport's); they are
# re-exported here, where callers have always imported them.
__all__ = ["DEFAULT_STORE", "CommandResult", "DeviceAddress", "SSHTransport", "Unreachable", "parse_address",
           "run_sync"]

# AES-GCM first: asyncssh builds a new ChaCha20 context per packet, AES-GCM runs in one OpenSSL
# context (30% faster uploads here); Jetson CPUs have the ARMv8 AES instructions.
_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "chacha20-poly1305@openssh.com",
            "aes128-ctr", "aes256-ctr")


# The board's sftp-server, found where OpenSSH's packages put it (Debian/Ubuntu/L4T first), run as root.
_SUDO_SFTP = ("sudo -n sh -c 'for s in /usr/lib/openssh/sftp-server /usr/libexec/openssh/sftp-server "
              "/usr/lib/ssh/sftp-server /usr/libexec/sftp-server; do [ -x \"$s\" ] && exec \"$s\"; done; "
              "echo no sftp-server >&2; exit 127'")


class Unreachable(DeployError):
    """The device could not be reached or the SSH session failed (network, auth, host key)."""


class SSHTransport:
    """One SSH connection to a device with an SFTP session; use as an async context manager.

    The :class:`~cuvil_edge.deploy.transport_base.Transport` of boards reached over SSH.
    """

    def __init__(self, address: DeviceAddress, connect_timeout: float = 15.0) -> None:
        self.address = address
        self.connect_timeout = connect_timeout
        self.conn: asyncssh.SSHClientConnection | None = None
        self.sftp: asyncssh.SFTPClient | None = None
        self.sudo = False  # root's operations go through ``sudo -n`` (the login user is not root)
        self.sudo_refused = ""  # sudo's refusal when the login user is not root and sudo -n failed

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
                await self._become_root()
                self.sftp = await (self._sudo_sftp() if self.sudo else self.conn.start_sftp_client())
            except BaseException:
                await self.close()  # no half-open connection left for the garbage collector
                raise
        except asyncssh.HostKeyNotVerifiable as exc:
            raise Unreachable(f"{a.label}: host key not verifiable ({exc.reason}); check known_hosts") from exc
        except asyncssh.PermissionDenied as exc:
            raise Unreachable(f"{a.label}: permission denied; check --identity and authorized_keys") from exc
        except (OSError, asyncio.TimeoutError, asyncssh.Error) as exc:
            raise Unreachable(f"{a.label}: cannot connect: {_reason(exc)}") from exc

    async def _become_root(self) -> None:
        """Decide whether root's operations go through ``sudo -n`` (see the module docstring)."""
        assert self.conn is not None
        if self.address.user == "root":
            return
        who = await self.conn.run("id -u", check=False, timeout=self.connect_timeout)
        if str(who.stdout or "").strip() in ("0", ""):
            return
        check = await self.conn.run("sudo -n true", check=False, timeout=self.connect_timeout)
        if check.exit_status == 0:
            self.sudo = True
        else:
            self.sudo_refused = " ".join(str(check.stderr or "").split())[:200] or "sudo -n true failed"

    async def _sudo_sftp(self) -> asyncssh.SFTPClient:
        """An SFTP client whose server is the board's ``sftp-server`` run by ``sudo -n`` (root's files)."""
        import inspect

        from asyncssh import sftp as _sftp_mod

        assert self.conn is not None
        writer, reader, _ = await self.conn.open_session(command=_SUDO_SFTP, encoding=None)
        start: Any = _sftp_mod.start_sftp_client  # its arguments changed across asyncssh releases
        params = inspect.signature(start).parameters
        # asyncssh's own start_sftp_client(), as SSHClientConnection.start_sftp_client() calls it on
        # the "sftp" subsystem's channel (2.14 to 2.21 take no utf8_decode_errors argument).
        extra = ["strict"] if "utf8_decode_errors" in params else []
        return await start(self.conn, asyncio.get_running_loop(), *extra, reader, writer, "utf-8", "strict",
                           _sftp_mod.MIN_SFTP_VERSION)

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

    async def stat(self, path: str) -> FileAttrs | None:
        """``lstat`` of ``path``, or None when it does not exist."""
        try:
            st = await self._sftp.lstat(path)
        except asyncssh.SFTPNoSuchFile:
            return None
        except (OSError, asyncssh.Error) as exc:
            raise self.error("stat", path, exc) from exc
        # SFTP file type 2 is a directory.
        return FileAttrs(size=int(st.size or 0), is_dir=st.type == 2, mtime=float(st.mtime or 0))

    async def exists(self, path: str) -> bool:
        return (await self.stat(path)) is not None

    async def makedirs(self, path: str) -> None:
        try:
            await self._sftp.makedirs(path, exist_ok=True)
        except (OSError, asyncssh.Error) as exc:
            raise self.error("mkdir", path, exc) from exc

    async def listdir(self, path: str) -> list[str]:
        try:
            names = await self._sftp.listdir(path)
        except asyncssh.SFTPNoSuchFile:
            return []
        except (OSError, asyncssh.Error) as exc:
            raise self.error("list", path, exc) from exc
        return sorted(n for n in names if n not in (".", ".."))

    async def readlink(self, path: str) -> str | None:
        try:
            return await self._sftp.readlink(path)
        except (asyncssh.SFTPNoSuchFile, asyncssh.SFTPFailure, asyncssh.SFTPInvalidParameter):
            return None
        except (OSError, asyncssh.Error) as exc:
            raise self.error("readlink", path, exc) from exc

    async def read_bytes(self, path: str, limit: int = 64 << 20) -> bytes | None:
        """Contents of a remote file, or None when it does not exist."""
        try:
            async with self._sftp.open(path, "rb") as f:
                data = await f.read(limit)
        except asyncssh.SFTPNoSuchFile:
            return None
        except (OSError, asyncssh.Error) as exc:
            raise self.error("read", path, exc) from exc
        return bytes(data) if isinstance(data, (bytes, bytearray)) else data.encode()

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
            raise self.error("write", path, exc) from exc

    async def create_exclusive(self, path: str, data: bytes) -> bool:
        """Create ``path`` holding ``data`` unless it exists (an exclusive SFTP open); False when it does."""
        try:
            f = await self._sftp.open(path, "xb")
        except asyncssh.SFTPFailure:
            return False
        except (OSError, asyncssh.Error) as exc:
            raise self.error("create", path, exc) from exc
        try:
            await f.write(data)
        finally:
            await f.close()
        return True

    async def symlink(self, target: str, link: str) -> None:
        try:
            await self._sftp.symlink(target, link)
        except (OSError, asyncssh.Error) as exc:
            raise self.error("symlink", link, exc) from exc

    async def rename(self, src: str, dst: str) -> None:
        """Atomic rename replacing ``dst`` (``posix-rename@openssh.com``)."""
        try:
            await self._sftp.posix_rename(src, dst)
        except (OSError, asyncssh.Error) as exc:
            raise self.error("rename", f"{src} -> {dst}", exc) from exc

    async def remove(self, path: str) -> None:
        try:
            await self._sftp.remove(path)
        except asyncssh.SFTPNoSuchFile:
            return
        except (OSError, asyncssh.Error) as exc:
            raise self.error("remove", path, exc) from exc

    async def rmtree(self, path: str) -> None:
        try:
            await self._sftp.rmtree(path, ignore_errors=False)
        except asyncssh.SFTPNoSuchFile:
            return
        except (OSError, asyncssh.Error) as exc:
            raise self.error("remove", path, exc) from exc

    async def open(self, path: str, mode: str) -> asyncssh.SFTPClientFile:
        try:
            return await self._sftp.open(path, mode)
        except (OSError, asyncssh.Error) as exc:
            raise self.error("open", path, exc) from exc

    # -- commands ------------------------------------------------------------------------------

    async def run(self, argv: list[str], timeout: float = 600.0, input: str | None = None) -> CommandResult:  # noqa: A002
        """Run a fixed argument vector on the device (each argument quoted); never raises on exit.

        ``input`` goes to the command's stdin (secrets travel there, not in argv).
        """
        if self.conn is None:
            raise Unreachable(f"{self.address.label}: not connected")
        try:
            res = await self.conn.run(shlex.join(self._argv(argv)), check=False, timeout=timeout, input=input)
        except (OSError, asyncssh.Error, asyncio.TimeoutError) as exc:
            raise self.error("run", argv[0], exc) from exc
        if res.exit_status is None and res.exit_signal is None:
            # The channel closed with neither an exit status nor a signal: the link dropped.
            raise Unreachable(f"{self.address.label}: run {argv[0]}: the connection closed before the command ended")
        return CommandResult(
            exit_status=res.exit_status if res.exit_status is not None else -1,
            stdout=str(res.stdout or ""),
            stderr=str(res.stderr or ""),
        )

    async def process(self, argv: list[str], merge_stderr: bool = False) -> asyncssh.SSHClientProcess:
        """Start a fixed argument vector on the device with streamed text stdin/stdout/stderr.

        Args:
            argv (list[str]): the command (each argument quoted).
            merge_stderr (bool): stderr joins stdout (a build log in order). Defaults to False.
        """
        if self.conn is None:
            raise Unreachable(f"{self.address.label}: not connected")
        try:
            return await self.conn.create_process(shlex.join(self._argv(argv)),
                                                  stderr=asyncssh.STDOUT if merge_stderr else asyncssh.PIPE)
        except (OSError, asyncssh.Error) as exc:
            raise self.error("run", argv[0], exc) from exc

    def _argv(self, argv: list[str]) -> list[str]:
        """``argv`` as root runs it: through ``sudo -n`` when the login user is not root."""
        return ["sudo", "-n", "--", *argv] if self.sudo else argv

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
            raise self.error("forward port", str(remote_port), exc) from exc
        try:
            yield listener.get_port()
        finally:
            listener.close()
            with contextlib.suppress(Exception):
                await listener.wait_closed()

    def error(self, op: str, path: str, exc: BaseException) -> DeployError:
        """A DeployError naming the device, the operation and the path (Unreachable for a lost link)."""
        cls = Unreachable if isinstance(exc, (asyncssh.ConnectionLost, asyncssh.DisconnectError,
                                               ConnectionError, BrokenPipeError)) else DeployError
        why = _reason(exc)
        if self.sudo_refused and isinstance(exc, (PermissionError, asyncssh.SFTPPermissionDenied)):
            why += f" (the login user is not root and sudo -n refused: {self.sudo_refused})"
        return cls(f"{self.address.label}: {op} {path}: {why}")


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
