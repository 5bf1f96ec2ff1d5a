"""A transport to a store on this machine: the same deploy steps, no network.

:class:`LocalTransport` implements :class:`~cuvil_edge.deploy.transport_base.Transport` on the local
file system and local processes. Deploy, rollback, status and the device step run unchanged, so a
store on this machine (a board deploying to itself, a test's store under ``tmp_path``, a store that a
later ``store install`` fills) goes through the very code a board does: resumable upload into
``.part`` files, sha256 checks, the device-side ``ondevice`` step under the device lock, the health
gate against the daemon's port. Address it as ``local`` (or ``local:NAME``) with ``--root`` and
``--store``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import stat
import subprocess
from collections.abc import AsyncIterator

from cuvil_edge.deploy.transport_base import CommandResult, DeviceAddress, FileAttrs
from cuvil_edge.errors import DeployError

__all__ = ["LocalTransport"]

_CHUNK = 1 << 20


class _LocalFile:
    """A local file with the async, offset-taking interface of an SFTP file."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    async def read(self, size: int = -1, offset: int | None = None) -> bytes:
        if offset is None:
            return await asyncio.to_thread(os.read, self.fd, size if size >= 0 else 1 << 30)
        return await asyncio.to_thread(os.pread, self.fd, size if size >= 0 else 1 << 30, offset)

    async def write(self, data: bytes, offset: int | None = None) -> int:
        if offset is None:
            return await asyncio.to_thread(os.write, self.fd, data)
        return await asyncio.to_thread(os.pwrite, self.fd, data, offset)

    async def truncate(self, size: int) -> None:
        await asyncio.to_thread(os.ftruncate, self.fd, size)

    async def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


class _TextWriter:
    def __init__(self, stream: asyncio.StreamWriter | None) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        if self.stream is not None:
            self.stream.write(text.encode())

    def write_eof(self) -> None:
        if self.stream is not None and not self.stream.is_closing():
            self.stream.close()


class _TextReader:
    def __init__(self, stream: asyncio.StreamReader | None) -> None:
        self.stream = stream

    async def readline(self) -> str:
        return (await self.stream.readline()).decode(errors="replace") if self.stream is not None else ""

    async def read(self) -> str:
        return (await self.stream.read()).decode(errors="replace") if self.stream is not None else ""

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        while True:
            line = await self.readline()
            if not line:
                return
            yield line


class _LocalProcess:
    """A local process with the text streams and exit fields of an asyncssh process."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.stdin = _TextWriter(proc.stdin)
        self.stdout = _TextReader(proc.stdout)
        self.stderr = _TextReader(proc.stderr)

    @property
    def exit_status(self) -> int | None:
        code = self.proc.returncode
        return code if code is not None and code >= 0 else None

    @property
    def exit_signal(self) -> int | None:
        code = self.proc.returncode
        return -code if code is not None and code < 0 else None

    async def wait(self, check: bool = False) -> int:
        return await self.proc.wait()

    def close(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()

    async def __aenter__(self) -> _LocalProcess:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
        with contextlib.suppress(Exception):
            await self.proc.wait()


class LocalTransport:
    """The :class:`~cuvil_edge.deploy.transport_base.Transport` of a store on this machine.

    Args:
        address (DeviceAddress): ``transport="local"``; its ``root`` and ``store`` are local paths.
        connect_timeout (float): unused (nothing to connect); kept for the common constructor.
    """

    def __init__(self, address: DeviceAddress, connect_timeout: float = 15.0) -> None:
        self.address = address
        self.connect_timeout = connect_timeout
        self.sudo = False  # this machine's store is the caller's own

    async def __aenter__(self) -> LocalTransport:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> None:
        if not os.path.isdir(self.address.root):
            raise DeployError(f"{self.address.label}: root {self.address.root} is not a directory")

    async def close(self) -> None:
        return None

    async def stat(self, path: str) -> FileAttrs | None:  # noqa: F811 - the method, not the module
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self.error("stat", path, exc) from exc
        return FileAttrs(size=st.st_size, is_dir=stat.S_ISDIR(st.st_mode), mtime=st.st_mtime)

    async def exists(self, path: str) -> bool:
        return (await self.stat(path)) is not None

    async def makedirs(self, path: str) -> None:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise self.error("mkdir", path, exc) from exc

    async def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise self.error("list", path, exc) from exc

    async def readlink(self, path: str) -> str | None:
        try:
            return os.readlink(path)
        except OSError:
            return None

    async def read_bytes(self, path: str, limit: int = 64 << 20) -> bytes | None:
        try:
            with open(path, "rb") as f:
                return f.read(limit)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self.error("read", path, exc) from exc

    async def write_bytes_atomic(self, path: str, data: bytes) -> None:
        tmp = f"{path}.tmp-{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise self.error("write", path, exc) from exc

    async def create_exclusive(self, path: str, data: bytes) -> bool:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        except OSError as exc:
            raise self.error("create", path, exc) from exc
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        return True

    async def symlink(self, target: str, link: str) -> None:
        try:
            os.symlink(target, link)
        except OSError as exc:
            raise self.error("symlink", link, exc) from exc

    async def rename(self, src: str, dst: str) -> None:
        try:
            os.replace(src, dst)
        except OSError as exc:
            raise self.error("rename", f"{src} -> {dst}", exc) from exc

    async def remove(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise self.error("remove", path, exc) from exc

    async def rmtree(self, path: str) -> None:
        try:
            await asyncio.to_thread(shutil.rmtree, path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise self.error("remove", path, exc) from exc

    async def open(self, path: str, mode: str) -> _LocalFile:
        flags = {"rb": os.O_RDONLY, "wb": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                 "r+b": os.O_RDWR, "xb": os.O_WRONLY | os.O_CREAT | os.O_EXCL}.get(mode)
        if flags is None:
            raise DeployError(f"{self.address.label}: open {path}: unsupported mode {mode!r}")
        try:
            return _LocalFile(os.open(path, flags, 0o644))
        except OSError as exc:
            raise self.error("open", path, exc) from exc

    async def run(self, argv: list[str], timeout: float = 600.0, input: str | None = None  # noqa: A002
                  ) -> CommandResult:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as exc:
            return CommandResult(127, "", f"{argv[0]}: {exc}")
        try:
            out, err = await asyncio.wait_for(proc.communicate(input.encode() if input is not None else None), timeout)
        except asyncio.TimeoutError as exc:
            proc.kill()
            await proc.wait()
            raise self.error("run", argv[0], exc) from exc
        return CommandResult(proc.returncode if proc.returncode is not None else -1,
                             out.decode(errors="replace"), err.decode(errors="replace"))

    async def process(self, argv: list[str], merge_stderr: bool = False) -> _LocalProcess:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE)
        except OSError as exc:
            raise self.error("run", argv[0], exc) from exc
        return _LocalProcess(proc)

    async def sha256(self, path: str) -> str:
        def digest() -> str:
            h = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(_CHUNK), b""):
                    h.update(block)
            return h.hexdigest()

        try:
            return await asyncio.to_thread(digest)
        except OSError as exc:
            raise DeployError(f"{self.address.label}: sha256 {path} failed: {exc}") from exc

    @contextlib.asynccontextmanager
    async def forward_local(self, remote_port: int, remote_host: str = "127.0.0.1") -> AsyncIterator[int]:
        """The daemon's port is already local: nothing to forward."""
        if remote_host not in ("127.0.0.1", "localhost", "::1"):
            raise DeployError(f"{self.address.label}: a local store reaches only this machine, not {remote_host}")
        yield remote_port

    def error(self, op: str, path: str, exc: BaseException) -> DeployError:
        return DeployError(f"{self.address.label}: {op} {path}: {_reason(exc)}")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc).strip() or type(exc).__name__
