"""Loopback "devices" for the deploy tests and benchmark: real OpenSSH servers, one root each.

Each :class:`SshDevice` is Debian's ``/usr/sbin/sshd`` on 127.0.0.1 and a free port, with its own
host key, an authorized_keys file holding the test client key, and its own directory standing in
as the board's root file system (``<root>/var/lib/cuvil-edge`` is the bundle store). The host
keys go into one known_hosts file, so host key checking stays on in the tests.

:func:`fake_board` writes the few files through which a device reports hardware we lack (an
aarch64 CPU, a Jetson device tree, L4T and TensorRT packages); nothing else is faked.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuvil_edge.deploy._asyncssh import asyncssh
from cuvil_edge.deploy.transport import DeviceAddress

SSHD = "/usr/sbin/sshd"
REPO = Path(__file__).resolve().parents[2]
PAUSE_ENV = "CUVIL_EDGE_TEST_PAUSE_DIR"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_HELD_PORTS: list[socket.socket] = []


def refused_port() -> int:
    """A port that refuses connections for the whole session: bound, never listening, kept open.

    A port from ``free_port`` can be taken by the next sshd or daemon a test starts, which turns an
    "unreachable" device into a reachable one (seen once in a full run).
    """
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    _HELD_PORTS.append(s)
    return int(s.getsockname()[1])


def make_key(path: Path) -> str:
    """Write a fresh ed25519 private key to ``path`` (0600); return the public key line."""
    key = asyncssh.generate_private_key("ssh-ed25519")
    path.parent.mkdir(parents=True, exist_ok=True)
    key.write_private_key(str(path))
    os.chmod(path, 0o600)
    return key.export_public_key().decode().strip()


@dataclass
class SshDevice:
    """One loopback device: a running sshd and its root directory."""

    name: str
    port: int
    root: Path
    host_pub: str
    proc: subprocess.Popen[bytes] | None = None
    workdir: Path = field(default_factory=Path)

    @property
    def store(self) -> Path:
        return self.root / "var/lib/cuvil-edge"

    @property
    def pause_dir(self) -> Path:
        """Where the device-side deploy step's test-only pause hook looks (``<step>.pause`` files)."""
        return self.workdir / "pause"

    def address(self, client_key: Path, known_hosts: Path, daemon_port: int = 8000) -> DeviceAddress:
        return DeviceAddress(
            host="127.0.0.1", port=self.port, user="root", name=self.name, root=str(self.root),
            store=str(self.store), daemon_port=daemon_port, identity=str(client_key),
            known_hosts=str(known_hosts),
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()
        self.proc = None


def start_sshd(workdir: Path, name: str, client_pub: str, sftp: bool = True) -> SshDevice:
    """Start sshd for a new device under ``workdir/name``; returns once it answers with its banner.

    ``sftp=False`` leaves out the SFTP subsystem: logins work, SFTP sessions are refused.
    """
    if not os.path.exists(SSHD):
        raise RuntimeError("sshd not installed: apt-get install openssh-server (scripts/bootstrap.sh test)")
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)
    base = workdir / name
    root = base / "root"
    (root / "var/lib").mkdir(parents=True, exist_ok=True)
    host_pub = make_key(base / "ssh_host_ed25519_key")
    (base / "pause").mkdir(exist_ok=True)
    (base / "authorized_keys").write_text(client_pub + "\n")
    last_err = ""
    for _ in range(5):
        port = free_port()
        cfg = base / "sshd_config"
        cfg.write_text(
            "\n".join(
                [
                    f"Port {port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {base / 'ssh_host_ed25519_key'}",
                    f"AuthorizedKeysFile {base / 'authorized_keys'}",
                    f"PidFile {base / 'sshd.pid'}",
                    "StrictModes no",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "PermitRootLogin prohibit-password",
                    "AllowTcpForwarding yes",
                    "MaxStartups 200",
                    "MaxSessions 100",
                    "UseDNS no",
                    "LogLevel ERROR",
                    f"Subsystem sftp {SFTP_SERVER}" if sftp else "",
                    # The device's "system" Python is this interpreter with this checkout's
                    # cuvil_edge, as if installed on the board; the test-only pause hook of the
                    # device-side deploy step reads a directory per device.
                    f"SetEnv PATH={Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin "
                    f"PYTHONPATH={REPO} {PAUSE_ENV}={base / 'pause'}",
                    "",
                ]
            )
        )
        proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(cfg)], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                last_err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                break
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5) as s:
                s.settimeout(2)
                if s.recv(8).startswith(b"SSH-"):
                    return SshDevice(name, port, root, host_pub, proc, base)
            time.sleep(0.05)
        else:
            proc.kill()
            proc.wait()
            last_err = "sshd did not answer within 10 s"
        if proc.stderr is not None:
            proc.stderr.close()
    raise RuntimeError(f"could not start sshd for {name}: {last_err}")


def write_known_hosts(path: Path, devices: list[SshDevice]) -> None:
    lines = [f"[127.0.0.1]:{d.port} {d.host_pub}" for d in devices]
    path.write_text("\n".join(lines) + "\n")


def fake_board(root: Path, kind: str) -> None:
    """Make a device root report hardware we lack here.

    Args:
        root (Path): the device root.
        kind (str): ``orin-nano-jp62`` models a Jetson Orin Nano 8GB developer kit on JetPack 6.2
            (L4T R36.4.3, TensorRT 10.3.0): the ``/proc/sys/kernel/arch`` and
            ``/proc/device-tree/model`` it shows, its ``/etc/nv_tegra_release`` first line and
            the dpkg status entry of the ``tensorrt`` package. ``orin-nano-jp6`` is the same
            board on JetPack 6.0 (L4T R36.3.0, TensorRT 8.6.2); ``agx-orin-jp62`` a Jetson AGX Orin
            64GB developer kit on JetPack 6.2 (same SM 8.7, another module). ``aarch64`` is a plain arm64
            board (only the kernel's architecture).
    """
    (root / "proc/sys/kernel").mkdir(parents=True, exist_ok=True)
    (root / "proc/sys/kernel/arch").write_text("aarch64\n")
    if kind == "aarch64":
        return
    releases = {"orin-nano-jp62": ("36", "4.3", "10.3.0.30-1+cuda12.5"),
                "orin-nano-jp6": ("36", "3.0", "8.6.2.3-1+cuda12.2"),
                "agx-orin-jp62": ("36", "4.3", "10.3.0.30-1+cuda12.5")}
    major, rev, trt = releases[kind]
    agx = kind.startswith("agx-orin")
    (root / "proc/device-tree").mkdir(parents=True, exist_ok=True)
    (root / "proc/device-tree/model").write_bytes(
        b"NVIDIA Jetson AGX Orin Developer Kit\x00" if agx
        else b"NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super\x00"
    )
    mem_kb = 64335836 if agx else 7823756
    (root / "proc/meminfo").write_text(f"MemTotal:        {mem_kb} kB\nMemFree:         4203000 kB\n")
    (root / "etc").mkdir(parents=True, exist_ok=True)
    (root / "etc/nv_tegra_release").write_text(
        f"# R{major} (release), REVISION: {rev}, GCID: 38968081, BOARD: generic, EABI: aarch64, "
        "DATE: Tue Jan  8 21:12:29 UTC 2025\n"
        "# KERNEL_VARIANT: oot\n"
    )
    (root / "var/lib/dpkg").mkdir(parents=True, exist_ok=True)
    (root / "var/lib/dpkg/status").write_text(
        "Package: tensorrt\nStatus: install ok installed\nPriority: optional\nSection: multiverse/devel\n"
        f"Architecture: arm64\nVersion: {trt}\nDescription: Meta package for TensorRT\n\n"
        "Package: libnvinfer10\nStatus: install ok installed\nArchitecture: arm64\n"
        f"Version: {trt}\nDescription: TensorRT runtime libraries\n\n"
    )
    (root / "var/lib/dpkg/available").write_text("")


def cleanup_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def python() -> str:
    return sys.executable


class CuttingProxy:
    """A loopback TCP proxy that cuts the connection after ``limit`` bytes from the client.

    Models a flaky field link: the SSH session dies mid-transfer, as when a cellular modem drops.
    Runs on the caller's asyncio loop.
    """

    def __init__(self, target_port: int, limit: int) -> None:
        self.target_port = target_port
        self.limit = limit
        self.forwarded = 0
        self.cut = False
        self.port = 0
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, count: bool) -> None:
            try:
                while True:
                    data = await src.read(65536)
                    if not data:
                        break
                    if count:
                        room = self.limit - self.forwarded
                        if len(data) >= room:
                            dst.write(data[: max(room, 0)])
                            await dst.drain()
                            self.forwarded += max(room, 0)
                            self.cut = True
                            break
                        self.forwarded += len(data)
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                for w in (writer, up_w):
                    w.close()

        await asyncio.gather(pump(reader, up_w, True), pump(up_r, writer, False))


class LinkProxy:
    """A loopback TCP proxy whose link the test cuts and heals on demand.

    :meth:`cut` drops every connection through it (both sides closed at once, as when a cellular
    modem loses its carrier) and, until :meth:`heal`, drops new ones as soon as they arrive, so the
    host's reconnects fail the way they would against a dead link. Runs on the caller's loop.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.down = False
        self.cuts = 0
        self._server: asyncio.base_events.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def cut(self) -> None:
        self.down = True
        self.cuts += 1
        for pair in list(self._pairs):
            for w in pair:
                w.transport.abort()

    def heal(self) -> None:
        self.down = False

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        finally:
            if task is not None:
                self._tasks.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down:
            writer.transport.abort()
            return
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        pair = (writer, up_w)
        self._pairs.add(pair)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while True:
                    data = await src.read(65536)
                    if not data or self.down:
                        break
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                for w in pair:
                    w.transport.abort()

        try:
            await asyncio.gather(pump(reader, up_w), pump(up_r, writer))
        finally:
            self._pairs.discard(pair)


def make_bundle(out: Path, secret_key: Path, version: str, *, name: str = "digits", target: str = "x86-host",
                bad_expected: bool = False, padding: int = 0, model: Path | None = None,
                jetpack: str | None = None) -> Path:
    """A signed bundle of the digits CNN with a real validation sample (ONNX Runtime outputs).

    ``bad_expected`` stores wrong expected outputs, so the health gate must fail on any daemon;
    ``padding`` adds a payload member of that many random bytes (benchmark bundle sizes);
    ``jetpack`` limits the target's releases to that one JetPack release.
    """
    import numpy as np
    import onnxruntime as ort

    from cuvil_edge.bundle import write_bundle
    from cuvil_edge.models import build_digits_cnn
    from cuvil_edge.models.digits import load_digits_data
    from cuvil_edge.targets import get_target

    out.parent.mkdir(parents=True, exist_ok=True)
    model = model or build_digits_cnn(out.parent / "digits.onnx")
    x, _ = load_digits_data()
    sample = x[:4]
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    logits = sess.run(["logits"], {"input": sample})[0]
    if bad_expected:
        logits = logits + 1.0
    import io

    def npz(**arrays: np.ndarray) -> bytes:
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        return buf.getvalue()

    t = get_target(target)
    manifest = {
        "name": name, "version": version,
        "target": {"name": t.name, "arch": t.arch, "gpu_sm": t.gpu_sm,
                   "releases": [r.__dict__ for r in t.releases if jetpack in (None, r.jetpack)]},
        "precision": "fp32", "format_kind": t.runtime_format, "model": "model.onnx",
        "inputs": [{"name": "input", "dtype": "float32", "shape": [-1, 1, 8, 8]}],
        "outputs": [{"name": "logits", "dtype": "float32", "shape": [-1, 10]}],
        "max_batch": 8,
        "preprocess": {"kind": "none"}, "postprocess": {"kind": "none"},
        "validation": {"report": "validation.json", "sample_inputs": "sample/inputs.npz",
                       "sample_expected": "sample/expected.npz", "rtol": 1e-3, "atol": 1e-3},
    }
    members: dict[str, Path | bytes] = {
        "model.onnx": model,
        "validation.json": json.dumps({"sample": 4}).encode(),
        "sample/inputs.npz": npz(input=sample),
        "sample/expected.npz": npz(logits=logits),
    }
    if padding:
        pad = out.parent / f".pad-{padding}"
        if not pad.exists():
            pad.write_bytes(os.urandom(padding))
        members["extra/padding.bin"] = pad
    write_bundle(out, manifest, members, secret_key)
    return out


class Daemon:
    """The real daemon (``cuvil-edged``) of one loopback device: a subprocess on 127.0.0.1 serving
    ``store``, verifying bundles with ``pub`` before it loads them."""

    def __init__(self, store: Path, pub: Path | None = None, port: int | None = None,
                 args: tuple[str, ...] = ()) -> None:
        self.store = store
        self.pub = pub
        self.args = args
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: Any = None

    def start(self) -> Daemon:
        self.store.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "cuvil_edge.daemon.main", "--store", str(self.store),
               "--port", str(self.port), "--log-level", "warning", "--intra-op-threads", "1",
               "--grpc", "0"]  # deploy speaks HTTP; no fixed gRPC port shared by parallel tests
        if self.pub is not None:
            cmd += ["--pub", str(self.pub)]
        cmd += list(self.args)
        self.log = open(self.store.parent / f"cuvil-edged-{self.port}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"cuvil-edged exited with {self.proc.returncode}: "
                                   f"{Path(self.log.name).read_text()[-2000:]}")
            with contextlib.suppress(OSError):
                if self.get("/v2/health/live")[0] == 200:
                    return self
            time.sleep(0.1)
        raise RuntimeError("cuvil-edged did not answer within 60 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self.log is not None:
            self.log.close()
            self.log = None

    def get(self, path: str) -> tuple[int, dict]:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as exc:
            body = exc.read()
            exc.close()
            return exc.code, json.loads(body or b"{}")
