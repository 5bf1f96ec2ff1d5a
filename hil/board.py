"""A board to run things on: the emulated arm64 board (qemu-system) or a real one over SSH.

Python API (also used by the memory-pressure benchmark)::

    from hil.board import boot

    with boot("qemu-system", mem_mb=1024, forwards=(8000,)) as board:
        board.ssh("systemctl is-system-running")          # CompletedProcess, raises on failure
        board.put("local.bin", "/tmp/remote.bin")
        port = board.port(8000)                           # 127.0.0.1:<port> reaches the guest's 8000

``boot`` builds the image on first use (cached by content hash, see :mod:`hil.images`), boots
it on a copy-on-write overlay (the cached image stays pristine) with SSH and the requested guest
ports forwarded to free loopback ports, and waits until systemd reports the system up. A board
that does not come up within the target's ``boot_timeout`` raises :class:`BootError` with the
serial console's last lines. Leaving the ``with`` block powers the VM off and deletes the
overlay, unless ``keep=True``.

The commands use the stock OpenSSH client (``ssh``/``scp``), exactly as a user would. As on a
stock JetPack board, the emulated board refuses root over SSH: the rig logs in as the image's
login user (``nvidia``, ``manifest.json``'s ``login_user``) and :meth:`Board.ssh` runs a line as
root through ``sudo -n`` (``sudo=False`` runs it as the login user); :meth:`Board.put` stages a
file in ``/tmp`` and moves it into place with sudo.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hil.errors import BoardCommandError, BootError, HilError
from hil.images import BoardImage, ensure_image
from hil.targets import HilTarget, get_hil_target

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_SPINNER = re.compile(r"^\[[ *]*\] (\(\d+ of \d+\) )?(A start job|A stop job|Job )")  # systemd's progress lines

__all__ = ["Board", "boot", "connect", "free_port", "reachable"]

QEMU = "qemu-system-aarch64"
# Units a disposable board does not need and that cost minutes under emulation on a loaded host
# (e2scrub_reap scans for LVM snapshots at every boot). Masked on the kernel command line, so the
# cached image stays as Debian made it.
BOOT_MASKS = "systemd.mask=e2scrub_reap.service systemd.mask=systemd-timesyncd.service"


def free_port() -> int:
    """A loopback TCP port free right now (the caller retries when it is taken in between)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def reachable(host: str, port: int, timeout: float = 5.0) -> bool:
    """True when an SSH server answers with its banner at ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout) as s:
            s.settimeout(timeout)
            return s.recv(4).startswith(b"SSH-")
    except OSError:
        return False


@dataclass
class Board:
    """A running board reachable over SSH.

    Args:
        target (HilTarget): the target it was started from.
        host (str): SSH address. ``127.0.0.1`` for an emulated board.
        ssh_port (int): SSH port.
        user (str): login user; not root, root's steps run through ``sudo -n`` (:meth:`ssh`).
        key (Path | None): private key.
        known_hosts (Path | None): known_hosts holding the board's host key; None disables the check.
        forwards (dict[int, int]): guest port -> loopback port on this machine.
        workdir (Path | None): the run's folder (console log, overlay) for an emulated board.
        fallback_from (str | None): the ``ssh`` target this board stands in for.
    """

    target: HilTarget
    host: str
    ssh_port: int
    user: str = "root"
    key: Path | None = None
    known_hosts: Path | None = None
    forwards: dict[int, int] = field(default_factory=dict)
    workdir: Path | None = None
    image: BoardImage | None = None
    fallback_from: str | None = None
    boot_seconds: float | None = None
    proc: subprocess.Popen[bytes] | None = None
    power_cuts: int = 0
    _tunnels: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _relaunch: Callable[[dict[int, int]], Board] | None = None
    _boot_budget: float = 900.0

    @property
    def emulated(self) -> bool:
        return self.target.kind == "qemu-system"

    @property
    def console_log(self) -> Path | None:
        return self.workdir / "console.log" if self.workdir else None

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.host}"

    def ssh_options(self, connect_timeout: float = 15.0) -> list[str]:
        """OpenSSH options that reach this board (also for ``scp``)."""
        opts = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(connect_timeout)}", "-o", "LogLevel=ERROR",
                "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=8"]
        if self.known_hosts is not None:
            opts += ["-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes"]
        else:
            opts += ["-o", "UserKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=no"]
        if self.key is not None:
            opts += ["-i", str(self.key), "-o", "IdentitiesOnly=yes"]
        return opts

    def ssh(self, command: str | Sequence[str], check: bool = True, timeout: float = 300.0,
            input: str | None = None, sudo: bool = True) -> subprocess.CompletedProcess[str]:
        """Runs ``command`` on the board (a shell line, or argv quoted for the remote shell), as root:
        through ``sudo -n sh -c`` when the login user is not root, unless ``sudo=False``.

        Raises:
            BoardCommandError: non-zero exit with ``check`` (the default).
            HilError: the command did not finish within ``timeout`` seconds.
        """
        line = command if isinstance(command, str) else shlex.join(command)
        if sudo and self.user != "root":
            line = "sudo -n sh -c " + shlex.quote(line)
        argv = ["ssh", *self.ssh_options(), "-p", str(self.ssh_port), self.destination, line]
        try:
            res = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout,
                                 stdin=None if input is not None else subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise HilError(f"on the board: `{line}` did not finish within {timeout:.0f} s") from None
        if check and res.returncode != 0:
            raise BoardCommandError(line, res.returncode, res.stdout, res.stderr)
        return res

    def put(self, local: str | os.PathLike[str], remote: str, timeout: float = 300.0) -> None:
        """Copies a local file (or folder) to ``remote`` on the board (scp); outside ``/tmp`` as root
        (staged in ``/tmp``, then moved with sudo) when the login user is not root."""
        recursive = ["-r"] if Path(local).is_dir() else []
        if self.user == "root" or remote.startswith("/tmp/"):
            self._scp([*recursive, str(local), f"{self.destination}:{remote}"], timeout)
            return
        staged = f"/tmp/.cuvil-hil-put-{os.getpid()}-{Path(remote).name}"
        self._scp([*recursive, str(local), f"{self.destination}:{staged}"], timeout)
        self.ssh(f"chown -R root:root {shlex.quote(staged)} && mv -fT {shlex.quote(staged)} {shlex.quote(remote)}")

    def get(self, remote: str, local: str | os.PathLike[str], timeout: float = 300.0) -> None:
        """Copies ``remote`` from the board to a local path (scp)."""
        self._scp([f"{self.destination}:{remote}", str(local)], timeout)

    def _scp(self, args: list[str], timeout: float) -> None:
        argv = ["scp", "-q", *self.ssh_options(), "-P", str(self.ssh_port), *args]
        try:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise HilError(f"scp {' '.join(args)} did not finish within {timeout:.0f} s") from None
        if res.returncode != 0:
            raise BoardCommandError("scp " + " ".join(args), res.returncode, res.stdout, res.stderr)

    def port(self, guest_port: int) -> int:
        """The loopback port on this machine that reaches ``guest_port`` on the board.

        An emulated board forwards the ports given to :func:`boot`; a real board gets an SSH
        tunnel (``ssh -L``) on first use.
        """
        if guest_port in self.forwards:
            return self.forwards[guest_port]
        if self.emulated:
            raise HilError(f"guest port {guest_port} is not forwarded; pass it in boot(..., forwards=)")
        local = free_port()
        proc = subprocess.Popen(
            ["ssh", *self.ssh_options(), "-N", "-o", "ExitOnForwardFailure=yes",
             "-L", f"127.0.0.1:{local}:127.0.0.1:{guest_port}", "-p", str(self.ssh_port), self.destination],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._tunnels.append(proc)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", local), 1):
                break
            if proc.poll() is not None:
                raise HilError(f"ssh -L for guest port {guest_port} exited {proc.returncode}")
            time.sleep(0.2)
        self.forwards[guest_port] = local
        return local

    def facts(self) -> dict[str, str]:
        """Architecture, kernel release and systemd version, as the board reports them."""
        out = self.ssh("uname -m; uname -r; systemctl --version | head -n1", timeout=60).stdout.split("\n")
        systemd = out[2].split()[1] if len(out) > 2 and out[2].startswith("systemd") else ""
        return {"arch": out[0].strip(), "kernel": out[1].strip(), "systemd": systemd}

    def console_tail(self, lines: int = 25) -> str:
        log = self.console_log
        if log is None or not log.is_file():
            return "(no console log)"
        text = _ANSI.sub("", log.read_bytes().decode("utf-8", "replace")).replace("\r", "\n")
        kept = [ln for ln in text.splitlines() if ln.strip() and not _SPINNER.search(ln)]
        return "\n".join(kept[-lines:])

    def power_cut(self) -> None:
        """Cuts the power of an emulated board: SIGKILL to QEMU. The guest loses everything it had
        not fsynced; its disk (the overlay, written by QEMU with the guest's flushes honoured when
        the board was booted with ``power_cuts=True``) stays for :meth:`power_on`."""
        if self.proc is None or self._relaunch is None:
            raise HilError("power_cut() needs an emulated board booted by boot()")
        self._stop_tunnels()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self.power_cuts += 1
        log = self.console_log
        if log is not None and log.is_file():  # keep each boot's console as evidence
            log.rename(log.with_name(f"console-boot{self.power_cuts}.log"))

    def power_on(self, console: object | None = None) -> float:
        """Boots the board again from the same disk, on the same loopback ports when they are free
        (a host that was talking to it reconnects as to a real board); seconds to multi-user."""
        if self._relaunch is None or (self.proc is not None and self.proc.poll() is None):
            raise HilError("power_on() needs an emulated board whose power was cut")
        from rich.console import Console

        again = self._relaunch({22: self.ssh_port, **self.forwards})
        self.proc, self.ssh_port, self.forwards = again.proc, again.ssh_port, again.forwards
        self.known_hosts = again.known_hosts
        _wait_up(self, self._boot_budget, console if console is not None else Console(stderr=True))
        if self.target.board:
            from hil.personality import apply_personality

            apply_personality(self, self.target.board)
        return float(self.boot_seconds or 0.0)

    def _stop_tunnels(self) -> None:
        for t in self._tunnels:
            t.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                t.wait(5)
        self._tunnels.clear()

    def close(self, keep: bool = False) -> None:
        """Stops the tunnels and, for an emulated board, the VM (unless ``keep``)."""
        for t in self._tunnels:
            t.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                t.wait(5)
        self._tunnels.clear()
        if self.proc is None or keep:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # QEMU exits at once; the overlay is thrown away
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None


def _qemu_argv(image: BoardImage, target: HilTarget, mem_mb: int, smp: int, overlay: Path, console: Path,
               hostfwd: dict[int, int], dtb: Path | None = None, dumpdtb: Path | None = None,
               cache: str = "unsafe") -> list[str]:
    fwd = "".join(f",hostfwd=tcp:127.0.0.1:{host}-:{guest}" for guest, host in hostfwd.items())
    machine = "virt" + (f",dumpdtb={dumpdtb}" if dumpdtb else "")
    argv = [QEMU, "-M", machine, "-accel", "tcg,thread=multi", "-cpu", target.cpu, "-smp", str(smp),
            "-m", str(mem_mb), "-kernel", str(image.kernel), "-initrd", str(image.initrd),
            "-append", " ".join(["root=/dev/vda rw console=ttyAMA0 net.ifnames=0 systemd.show_status=error",
                                 BOOT_MASKS, *_personality_kernel_args(target)]),
            "-drive", f"file={overlay},if=virtio,format=qcow2,cache={cache}",
            "-netdev", f"user,id=n0{fwd}", "-device", "virtio-net-pci,netdev=n0,romfile=",
            "-device", "virtio-rng-pci",
            "-display", "none", "-serial", f"file:{console}", "-monitor", "none", "-no-reboot"]
    if dtb is not None:
        argv += ["-dtb", str(dtb)]
    return argv


def _personality_kernel_args(target: HilTarget) -> tuple[str, ...]:
    """The board personality's kernel arguments (``psi=0`` on L4T 36), none without a personality."""
    from hil.personality import kernel_args

    return kernel_args(target.board)


@contextlib.contextmanager
def boot(target: str | HilTarget = "qemu-system", *, mem_mb: int | None = None, smp: int | None = None,
         forwards: Sequence[int] = (8000,), keep: bool = False, workdir: Path | None = None,
         console: object | None = None, boot_timeout: float | None = None,
         power_cuts: bool = False) -> Iterator[Board]:
    """Boots the emulated arm64 board and yields it once systemd reports the system up.

    Args:
        target (str | HilTarget): a ``qemu-system`` target or its name. Defaults to ``qemu-system``.
        mem_mb (int | None): guest RAM, MiB. Defaults to the target's ``mem_mb``.
        smp (int | None): guest CPUs. Defaults to the target's ``smp``.
        forwards (Sequence[int]): guest TCP ports to forward to loopback (SSH always is).
            Defaults to ``(8000,)``, the daemon's port.
        keep (bool): leave the VM running and its folder in place after the block. Defaults to False.
        workdir (Path | None): the run's folder (overlay, console log). Defaults to a temp folder.
        console (rich.console.Console | None): progress output. Defaults to stderr.
        boot_timeout (float | None): seconds to reach multi-user. Defaults to the target's.
        power_cuts (bool): the board's power will be cut (:meth:`Board.power_cut`): QEMU honours
            the guest's disk flushes (``cache=writeback``) so the overlay holds exactly what the
            guest made durable, as a disk would; otherwise flushes are skipped (``cache=unsafe``,
            faster). Defaults to False.

    Raises:
        BootError: QEMU did not start, or the board was not up within the budget (console tail).
    """
    from rich.console import Console

    tgt = get_hil_target(target) if isinstance(target, str) else target
    if tgt.kind != "qemu-system":
        raise HilError(f"target '{tgt.name}' is of kind '{tgt.kind}'; boot() needs a qemu-system target")
    if shutil.which(QEMU) is None:
        raise BootError(f"{QEMU} not found: run scripts/bootstrap.sh test (apt: qemu-system-arm)")
    con = console if console is not None else Console(stderr=True)
    image = ensure_image(console=con)
    own_dir = workdir is None
    run_dir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="cuvil-hil-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    overlay = run_dir / "overlay.qcow2"
    console_log = run_dir / "console.log"
    mem = int(mem_mb or tgt.mem_mb)
    cpus = int(smp or tgt.smp)
    budget = float(boot_timeout or tgt.boot_timeout)
    board: Board | None = None
    try:
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(image.disk), str(overlay)],
                       check=True, capture_output=True, timeout=60)
        known_hosts = run_dir / "known_hosts"
        dtb = None
        if tgt.board:
            from hil.personality import personality_dtb

            dtb = personality_dtb(tgt.board, run_dir, lambda dump: _qemu_argv(
                image, tgt, mem, cpus, overlay, console_log, {}, dumpdtb=dump))
        cache = "writeback" if power_cuts else "unsafe"
        board = _start_vm(image, tgt, mem, cpus, overlay, console_log, forwards, dtb, run_dir, known_hosts,
                          cache=cache)
        board._boot_budget = budget
        board._relaunch = lambda ports: _start_vm(image, tgt, mem, cpus, overlay, console_log, forwards, dtb,
                                                  run_dir, known_hosts, cache=cache, ports=ports)
        _wait_up(board, budget, con)
        if tgt.board:
            from hil.personality import apply_personality

            apply_personality(board, tgt.board)
        yield board
    finally:
        if board is not None:
            board.close(keep=keep)
            if keep and board.proc is not None:
                con.print(f"[bold]kept[/] the board running (pid {board.proc.pid}): ssh -i {image.key} "
                          f"-o UserKnownHostsFile={board.known_hosts} -p {board.ssh_port} {board.user}@127.0.0.1; "
                          f"folder {run_dir}")
        if own_dir and not keep:
            shutil.rmtree(run_dir, ignore_errors=True)


def _start_vm(image: BoardImage, tgt: HilTarget, mem: int, cpus: int, overlay: Path, console_log: Path,
              forwards: Sequence[int], dtb: Path | None, run_dir: Path, known_hosts: Path, cache: str = "unsafe",
              ports: dict[int, int] | None = None) -> Board:
    last = ""
    for attempt in range(4):  # a port picked free can be taken before QEMU binds it: pick again
        if ports and attempt < 2:  # the same ports as before a power cut (retry once: a socket may linger)
            fwd = dict(ports)
            ssh_port = fwd[22]
        else:
            ssh_port = free_port()
            fwd = {22: ssh_port, **{int(g): free_port() for g in forwards}}
        if len(set(fwd.values())) != len(fwd):
            continue
        host_pub = (image.dir / "host_key.pub")
        if host_pub.is_file():
            key_type, key_b64 = host_pub.read_text().split()[:2]
            known_hosts.write_text(f"[127.0.0.1]:{ssh_port} {key_type} {key_b64}\n")
        argv = _qemu_argv(image, tgt, mem, cpus, overlay, console_log, fwd, dtb=dtb, cache=cache)
        (run_dir / "qemu.argv").write_text(shlex.join(argv) + "\n")
        stderr_path = run_dir / "qemu.stderr"
        with open(stderr_path, "wb") as err:
            proc = subprocess.Popen(["nice", "-n", "5", *argv], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        time.sleep(0.5)
        if proc.poll() is None or proc.returncode == 0:
            return Board(target=tgt, host="127.0.0.1", ssh_port=ssh_port, key=image.key, user=image.login_user,
                         known_hosts=known_hosts if host_pub.is_file() else None,
                         forwards={g: h for g, h in fwd.items() if g != 22}, workdir=run_dir, image=image,
                         proc=proc)
        last = stderr_path.read_text(errors="replace").strip()
        if "hostfwd" not in last and "forwarding" not in last:
            break
        time.sleep(1.0)
    raise BootError(f"{QEMU} did not start: {last[-800:]}")


def _wait_up(board: Board, budget: float, con: object) -> None:
    """Waits for sshd, then for systemd to leave ``starting`` (running or degraded)."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    t0 = time.monotonic()
    deadline = t0 + budget
    assert board.proc is not None
    with Progress(SpinnerColumn(), TextColumn("[bold]board[/] {task.description}"), TimeElapsedColumn(),
                  console=con, transient=True) as progress:  # type: ignore[arg-type]
        task = progress.add_task("booting (kernel, systemd)")
        while not reachable(board.host, board.ssh_port, 3):
            if board.proc.poll() is not None:
                raise BootError(f"QEMU exited ({board.proc.returncode}) during boot; console:\n{board.console_tail()}")
            if time.monotonic() > deadline:
                raise BootError(f"the board did not answer on SSH within {budget:.0f} s; console:\n"
                                f"{board.console_tail()}")
            time.sleep(1)
        progress.update(task, description="waiting for multi-user.target")
        state = ""
        while time.monotonic() < deadline:
            left = max(5, int(deadline - time.monotonic()))
            res = board.ssh(f"timeout {left} systemctl is-system-running --wait", check=False, timeout=left + 30)
            state = res.stdout.strip()
            if state in ("running", "degraded"):
                break
            if res.returncode == 255:  # ssh itself failed: sshd just started, retry
                time.sleep(2)
                continue
        else:
            raise BootError(f"the board did not reach multi-user.target within {budget:.0f} s "
                            f"(systemd: {state or 'unknown'}); console:\n{board.console_tail()}")
        active = board.ssh("systemctl is-active multi-user.target", check=False).stdout.strip()
        if active != "active":
            raise BootError(f"multi-user.target is '{active}' (systemd: {state}); console:\n{board.console_tail()}")
    board.boot_seconds = round(time.monotonic() - t0, 1)
    if state == "degraded":
        failed = board.ssh("systemctl --failed --no-legend --plain", check=False).stdout.strip()
        con.print(f"[yellow]board up in {board.boot_seconds} s but degraded[/]: {failed}")  # type: ignore[attr-defined]
    else:
        con.print(f"board up in {board.boot_seconds} s (systemd: {state})")  # type: ignore[attr-defined]


def connect(target: str | HilTarget, console: object | None = None) -> Board:
    """A real board over SSH, checked reachable (banner within ``connect_timeout``).

    Raises:
        HilError: the board does not answer (the caller may fall back to ``target.fallback``).
    """
    tgt = get_hil_target(target) if isinstance(target, str) else target
    if tgt.kind != "ssh":
        raise HilError(f"target '{tgt.name}' is of kind '{tgt.kind}'; connect() needs an ssh target")
    if not reachable(tgt.host, tgt.port, tgt.connect_timeout):
        raise HilError(f"{tgt.name}: no SSH server answers at {tgt.host}:{tgt.port} "
                       f"(within {tgt.connect_timeout:.0f} s)")
    kh = Path(os.path.expanduser(tgt.known_hosts)) if tgt.known_hosts else None
    return Board(target=tgt, host=tgt.host, ssh_port=tgt.port, user=tgt.user, key=tgt.key_path, known_hosts=kh)
