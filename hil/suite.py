"""The on-device suite: what a user does with a board, run from this machine against it.

Each check is a plain function of a :class:`SuiteContext` that raises on failure and returns
details for the report. They run in order (later checks build on earlier ones: the daemon
installed, a bundle deployed), through ``hil/run`` or pytest (``tests/hil``), never mocked:
the host's ``cuvil-edge`` CLI over real SSH, ``systemctl`` on the board, tritonclient through
the forwarded port.

``smoke`` keeps CI short (boot, install, kernels, install-daemon + READY, one deploy, infer ==
FP32); ``full`` adds the upgrade, reload, failing gate + rollback, watchdog, stop/drain,
systemd-analyze security, board identity and tegrastats checks, and the power cuts;
``powercut`` is the prerequisites and the power cuts (:data:`CUTS`): QEMU is killed at a named
point of a deploy, the board boots again from the same disk, and within the confirm deadline it
must serve a version that passed its gate, whose files verify and which its state file names.

A check that makes the daemon log an ERROR line on purpose declares it (``Check.expected_errors``);
any other ERROR line of the daemon fails the run (``hil/runner.py``).
"""

from __future__ import annotations

import functools
import json
import re
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hil.board import Board
from hil.errors import HilError

__all__ = ["CHECKS", "SUITES", "Check", "CheckFailed", "CheckSkipped", "SuiteContext", "checks_for"]

UNIT = "cuvil-edged.service"
DAEMON_PORT = 8000
DROPIN_DIR = "/etc/systemd/system/cuvil-edged.service.d"
TRT_MODEL = "hiltrt"  # the TensorRT-form bundle of the Jetson personality's checks
WATCHDOG_SEC = 10
REPO = Path(__file__).resolve().parent.parent


class CheckFailed(HilError):
    """A check of the on-device suite failed (the message says what was expected and seen)."""


class CheckSkipped(HilError):
    """A check does not apply to this target (the message says why)."""


@dataclass
class SuiteContext:
    """What the checks share: the board, a host work folder, and facts for the report."""

    board: Board
    workdir: Path
    info: dict[str, Any] = field(default_factory=dict)
    bundles: dict[str, Path] = field(default_factory=dict)
    workdir_run: Path | None = None  # the run's evidence folder (journals of each boot go there)
    expected_errors: list[str] = field(default_factory=list)  # regexes the checks that ran declared
    journal_errors: list[str] = field(default_factory=list)  # daemon ERROR lines of boots that ended in a cut
    _keys: tuple[Path, Path] | None = None

    # ------------------------------------------------------------------ host side

    @property
    def known_hosts(self) -> Path | None:
        return self.board.known_hosts

    def device_args(self) -> list[str]:
        """``cuvil-edge`` options that reach the board, as a user would type them."""
        b = self.board
        args = ["--to", f"{b.user}@{b.host}:{b.ssh_port}"]
        if b.key is not None:
            args += ["--identity", str(b.key)]
        args += ["--known-hosts", str(b.known_hosts)] if b.known_hosts else ["--no-host-key-check"]
        return args

    def cli(self, *args: str, timeout: float = 600, env: dict[str, str] | None = None,
            ) -> subprocess.CompletedProcess[str]:
        """Runs this tree's ``cuvil-edge`` CLI on the host (``env``: extra environment variables)."""
        import os

        argv = [sys.executable, "-m", "cuvil_edge.cli", *args]
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                                  stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
        except subprocess.TimeoutExpired:
            raise CheckFailed(f"cuvil-edge {' '.join(args[:2])} did not finish within {timeout:.0f} s") from None

    def keys(self) -> tuple[Path, Path]:
        if self._keys is None:
            from hil.bundles import make_keys

            self._keys = make_keys(self.workdir / "keys")
        return self._keys

    def bundle(self, label: str) -> Path:
        """The suite's bundle ``v1``, ``v2`` or ``bad`` (built on first use)."""
        if label not in self.bundles:
            from hil.bundles import make_suite_bundle

            versions = {"v1": ("1.0.0", False), "v2": ("1.1.0", False), "bad": ("2.0.0", True)}
            version, bad = versions[label]
            self.bundles[label] = make_suite_bundle(self.workdir / "bundles" / f"hilnet-{version}.cvb",
                                                    self.keys()[0], version, bad_gate=bad)
        return self.bundles[label]

    def cut_bundle(self, version: str, bad_gate: bool = False, padding: int = 0) -> Path:
        """A bundle of the suite model at ``version`` for a power cut (``padding`` bytes of payload
        make the upload and the extraction long enough to cut in the middle)."""
        key = f"cut-{version}"
        if key not in self.bundles:
            from hil.bundles import make_suite_bundle

            self.bundles[key] = make_suite_bundle(self.workdir / "bundles" / f"hilnet-{version}.cvb",
                                                  self.keys()[0], version, bad_gate=bad_gate, padding=padding)
        return self.bundles[key]

    def deploy(self, label: str) -> tuple[int, dict[str, Any]]:
        """``cuvil-edge deploy`` of a suite bundle; returns (exit code, the device's report entry)."""
        report = self.workdir / f"deploy-{label}.json"
        res = self.cli("deploy", str(self.bundle(label)), *self.device_args(), "--pub", str(self.keys()[1]),
                       "--health-timeout", "240", "--confirm-deadline", "300", "--connect-timeout", "30",
                       "--report", str(report), "--json")
        if not report.is_file():
            raise CheckFailed(f"deploy {label} wrote no report (exit {res.returncode}): "
                              f"{(res.stderr or res.stdout).strip()[-600:]}")
        data = json.loads(report.read_text())
        devices = data.get("devices") or data.get("results") or []
        entry = devices[0] if devices else data
        return res.returncode, entry

    def client(self) -> Any:
        import tritonclient.http as httpclient

        return httpclient.InferenceServerClient(url=f"127.0.0.1:{self.board.port(DAEMON_PORT)}",
                                                connection_timeout=60, network_timeout=120)

    # ------------------------------------------------------------------ board side

    def unit_state(self) -> dict[str, str]:
        out = self.board.ssh(["systemctl", "show", "-p", "ActiveState,SubState,NRestarts,Result,StatusText,"
                              "ExecMainStatus,MainPID", UNIT], timeout=60).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def wait_unit(self, active: str, sub: str, timeout: float = 300, since_restarts: int | None = None) -> dict[str, str]:
        """Polls ``systemctl show`` until the unit is in ``active``/``sub`` (and restarted)."""
        deadline = time.monotonic() + timeout
        state: dict[str, str] = {}
        while time.monotonic() < deadline:
            state = self.unit_state()
            restarted = since_restarts is None or int(state.get("NRestarts", "0") or 0) > since_restarts
            if state.get("ActiveState") == active and state.get("SubState") == sub and restarted:
                return state
            if state.get("ActiveState") == "failed":
                break
            time.sleep(1)
        journal = self.board.ssh(["journalctl", "-u", UNIT, "-n", "25", "--no-pager"], check=False).stdout
        raise CheckFailed(f"{UNIT} did not reach {active}/{sub} within {timeout:.0f} s "
                          f"(last: {state.get('ActiveState')}/{state.get('SubState')}, restarts "
                          f"{state.get('NRestarts')}); journal:\n{journal[-1500:]}")

    def served_version(self, timeout: float = 120) -> str:
        """The version the daemon serves the suite model at (waits for it to be ready)."""
        from tritonclient.utils import InferenceServerException

        from hil.bundles import MODEL_NAME

        deadline = time.monotonic() + timeout
        last = ""
        client = self.client()
        try:
            while time.monotonic() < deadline:
                try:
                    if client.is_model_ready(MODEL_NAME):
                        return str(client.get_model_metadata(MODEL_NAME)["versions"][0])
                except (InferenceServerException, OSError, ConnectionError) as exc:
                    last = str(exc)
                time.sleep(1)
        finally:
            client.close()
        raise CheckFailed(f"model {MODEL_NAME} not ready on the board within {timeout:.0f} s ({last})")


def _expect(cond: bool, message: str) -> None:
    if not cond:
        raise CheckFailed(message)


# ---------------------------------------------------------------------- checks

def check_boot(ctx: SuiteContext) -> dict[str, Any]:
    """The board answers over SSH with systemd as PID 1: architecture, kernel, systemd version."""
    facts = ctx.board.facts()
    pid1 = ctx.board.ssh("cat /proc/1/comm").stdout.strip()
    ctx.info.update(facts)
    _expect(facts["arch"] == "aarch64", f"the board reports arch {facts['arch']!r}, expected aarch64")
    _expect(pid1 == "systemd", f"PID 1 is {pid1!r}, not systemd")
    _expect(bool(facts["systemd"]), "systemctl --version printed no version")
    return {**facts, "pid1": pid1, "boot_seconds": ctx.board.boot_seconds}


PASSWORD_SUDO_USER = "jetson"  # the image's second user: in the sudo group, sudo asks for a password


def check_login_user(ctx: SuiteContext) -> dict[str, Any]:
    """As a stock JetPack board: root SSH is refused, the rig's login user is not root and reaches
    root only through ``sudo -n``; a user whose sudo asks for a password gets one clear line from
    ``cuvil-edge install-daemon`` (and the board is left untouched)."""
    b = ctx.board
    if not b.emulated:
        raise CheckSkipped("the login rules are the emulated board's image (a real board has its own)")
    _expect(b.user != "root", f"the rig logs in as {b.user!r}; the image must refuse root over SSH")
    uid = b.ssh("id -u", sudo=False).stdout.strip()
    _expect(uid not in ("", "0"), f"the login user {b.user} has uid {uid!r}")
    root = subprocess.run(["ssh", *b.ssh_options(), "-p", str(b.ssh_port), f"root@{b.host}", "true"],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    _expect(root.returncode == 255 and "denied" in root.stderr.lower(),
            f"root SSH was not refused (exit {root.returncode}): {root.stderr.strip()[-300:]}")
    as_root = b.ssh("id -u").stdout.strip()
    _expect(as_root == "0", f"sudo -n as {b.user} gave uid {as_root!r}")
    args = ["--to", f"{PASSWORD_SUDO_USER}@{b.host}:{b.ssh_port}", *ctx.device_args()[2:]]
    res = ctx.cli("install-daemon", *args, "--json", "--connect-timeout", "30", timeout=600)
    out = json.loads(res.stdout) if res.stdout.lstrip().startswith("[") else []
    reason = str(out[0].get("reason", "")) if out else ""
    _expect(res.returncode != 0 and "sudo needs a password" in reason and "\n" not in reason,
            f"install-daemon as {PASSWORD_SUDO_USER} (sudo asks a password) exited {res.returncode}: "
            f"{(reason or res.stderr or res.stdout).strip()[-400:]}")
    touched = b.ssh(f"test -e /etc/systemd/system/{UNIT} && echo yes || echo no").stdout.strip()
    _expect(touched == "no", "the refused install-daemon left a unit on the board")
    return {"login_user": b.user, "uid": uid, "root_ssh": root.stderr.strip()[-120:],
            "password_sudo_user": PASSWORD_SUDO_USER, "install_daemon_says": reason}


def check_install_project(ctx: SuiteContext) -> dict[str, Any]:
    """A wheel of the tree under test installs on the board with pip (no network)."""
    from hil.project import install_project

    version = install_project(ctx.board)
    which = ctx.board.ssh("command -v cuvil-edged; command -v cuvil-edge").stdout.split()
    _expect(which == ["/usr/local/bin/cuvil-edged", "/usr/local/bin/cuvil-edge"],
            f"console scripts not where the unit expects them: {which}")
    return {"version": version}


def _expected_isa(ctx: SuiteContext) -> str:
    t = ctx.board.target
    if t.kind == "qemu-system":
        return "sve2" if t.cpu.startswith("max") and "sve=off" not in t.cpu else "neon"
    if t.board:
        from cuvil_edge.targets import get_target

        isas = get_target(t.board).isa
        return next((i for i in ("sve2", "sve", "neon") if i in isas), "neon")
    return "neon"


def check_kernels(ctx: SuiteContext) -> dict[str, Any]:
    """The cross-built kernels load on the board and dispatch to its best ISA (NEON on Orin's stand-in)."""
    code = "import json, cuvil_edge.sve as s; print(json.dumps(s.cpu_info()))"
    info = json.loads(ctx.board.ssh(["python3", "-c", code], timeout=300).stdout)
    want = _expected_isa(ctx)
    ctx.info["kernels_isa"] = info["isa"]
    ctx.info["kernels_available"] = info["available"]
    _expect(info["platform"] == "linux-aarch64", f"kernels loaded for {info['platform']}")
    _expect(info["isa"]["resize_normalize"] == want,
            f"resize_normalize dispatched to {info['isa']['resize_normalize']}, expected {want} ({info['message']})")
    return {"isa": info["isa"], "available": info["available"], "expected": want}


def _write_dropin(ctx: SuiteContext) -> None:
    lines = ["# HIL rig: watchdog short enough to test, debug fault hooks on (tests only)", "[Service]",
             f"WatchdogSec={WATCHDOG_SEC}", "Environment=CUVIL_EDGED_DEBUG_FAULT_HOOKS=1"]
    if ctx.board.emulated:
        # QEMU's port forward arrives on the guest's network (10.0.2.15), not its loopback: listen
        # there and let only the QEMU host (10.0.2.2) in, as the unit's comment says to.
        # A Jetson personality serves the stand-in builder's engines (labelled; no TensorRT here).
        standin = " --engine-standin 1" if ctx.board.target.board else ""
        lines += ["ExecStart=", f"ExecStart={_daemon_exe(ctx)} --store /var/lib/cuvil-edge --host 0.0.0.0 "
                  f"--port {DAEMON_PORT} --telemetry auto{standin}", "IPAddressAllow=10.0.2.2"]
    ctx.board.ssh(f"mkdir -p {DROPIN_DIR} && cat > {DROPIN_DIR}/hil.conf", input="\n".join(lines) + "\n")


VENV = "/opt/cuvil-edge/venv"


def _daemon_exe(ctx: SuiteContext) -> str:
    """Where the daemon runs from: the venv install-daemon makes on a Jetson personality (from wheels
    the host prepared; the board is offline), the system install elsewhere."""
    return f"{VENV}/bin/cuvil-edged" if ctx.board.target.board else "/usr/local/bin/cuvil-edged"


def check_install_daemon(ctx: SuiteContext) -> dict[str, Any]:
    """``cuvil-edge install-daemon`` puts the unit in place; systemd starts it and gets READY=1. On a
    Jetson personality it first installs the project from host-prepared wheels into a venv that
    sees the system's (apt) TensorRT."""
    _write_dropin(ctx)
    t0 = time.monotonic()
    extra: list[str] = []
    if ctx.board.target.board:
        from hil.project import build_wheel

        wheels = ctx.workdir / "board-wheels"
        build_wheel(wheels)
        # The image carries the dependencies in the system Python; the venv sees them.
        extra = ["--wheels", str(wheels), "--no-deps", "--venv", VENV]
    res = ctx.cli("install-daemon", *ctx.device_args(), "--json", "--connect-timeout", "30", *extra, timeout=1800)
    _expect(res.returncode == 0, f"install-daemon exited {res.returncode}: {(res.stderr or res.stdout).strip()[-600:]}")
    out = json.loads(res.stdout)
    entry = out[0] if isinstance(out, list) else (out.get("devices") or out.get("results") or [out])[0]
    _expect(entry.get("status") in ("installed", "unchanged"), f"install-daemon: {entry}")
    _expect(bool(entry.get("systemd_running")), f"install-daemon did not see systemd running: {entry}")
    _expect(bool(entry.get("sudo")) == (ctx.board.user != "root"),
            f"install-daemon as {ctx.board.user} reports sudo={entry.get('sudo')}")
    # Type=notify: active/running only after the daemon's READY=1 reached systemd.
    state = ctx.wait_unit("active", "running", timeout=300)
    ready_s = round(time.monotonic() - t0, 1)
    enabled = ctx.board.ssh(["systemctl", "is-enabled", UNIT], check=False).stdout.strip()
    _expect(enabled == "enabled", f"{UNIT} is {enabled!r} after install-daemon")
    groups = _daemon_groups(ctx, state)
    if ctx.board.target.board:
        from cuvil_edge.targets import get_target
        from hil.personality import PERSONALITIES

        board = ctx.board.target.board
        trt = next(r for r in get_target(board).releases if r.jetpack == PERSONALITIES[board].jetpack).tensorrt
        _expect(entry.get("exec_start") == f"{VENV}/bin/cuvil-edged",
                f"install-daemon wrote ExecStart={entry.get('exec_start')}, not the venv's")
        _expect(entry.get("tensorrt") == trt, f"the venv imports TensorRT {entry.get('tensorrt')!r}, expected the "
                                             f"system's {trt} (--system-site-packages)")
        exe = ctx.board.ssh(f"readlink /proc/{state.get('MainPID')}/exe; tr '\\0' ' ' < /proc/{state.get('MainPID')}"
                            "/cmdline", check=False).stdout
        _expect(VENV in exe, f"the daemon does not run from the venv: {exe.strip()[:200]}")
        # L4T: the GPU nodes are root:video, the render node root:render, jtop's socket root:jtop;
        # install-daemon adds jtop (a drop-in) because this board has the group.
        missing = {"video", "render", "jtop"} - set(groups)
        _expect(not missing, f"the daemon runs without group(s) {sorted(missing)} (it has {groups})")
    paged_out = _paged_out_mb(ctx)
    return {"install": entry.get("status"), "as": ctx.board.user, "sudo": entry.get("sudo"),
            "state": f"{state['ActiveState']}/{state['SubState']}",
            "status_text": state.get("StatusText"), "ready_seconds": ready_s, "enabled": enabled, "groups": groups,
            "library_pages_handed_back_mb": paged_out}


def _paged_out_mb(ctx: SuiteContext) -> float:
    """The MB of library pages the daemon handed back before READY (``madvise(MADV_PAGEOUT)``), read
    from its journal: under the unit's system-call filter, on the board's kernel, it must work."""
    deadline = time.monotonic() + 20
    while True:
        journal = ctx.board.ssh(["journalctl", "-u", UNIT, "--no-pager", "-o", "cat"], check=False).stdout
        refused = [line for line in journal.splitlines() if "library pages stay resident" in line]
        _expect(not refused, f"the daemon could not hand its library pages back: {refused[-1][:300] if refused else ''}")
        m = re.findall(r"handed back ([\d.]+) MB of library pages", journal)
        if m:
            # numpy, grpc and ONNX Runtime are the daemon's alone on the board: nothing handed back
            # means the mechanism does not work there (MADV_PAGEOUT freed 0.0 MB under the unit).
            _expect(float(m[-1]) >= 1.0, f"the daemon handed back only {m[-1]} MB of library pages")
            return float(m[-1])
        _expect(time.monotonic() < deadline, "the daemon's journal has no 'handed back ... MB of library pages' line")
        time.sleep(1)


def _daemon_groups(ctx: SuiteContext, state: dict[str, str]) -> list[str]:
    """The supplementary groups of the daemon's main process, by name."""
    pid = state.get("MainPID", "0")
    out = ctx.board.ssh(f"for g in $(sed -n 's/^Groups:\\t*//p' /proc/{pid}/status); do getent group $g | "
                        "cut -d: -f1; done", check=False).stdout
    return sorted(out.split())


def check_deploy_fresh(ctx: SuiteContext) -> dict[str, Any]:
    """``cuvil-edge deploy`` over SSH: a fresh install passes its health gate and serves."""
    rc, entry = ctx.deploy("v1")
    _expect(rc == 0, f"deploy of 1.0.0 exited {rc}: {entry}")
    served = ctx.served_version()
    _expect(served == "1.0.0", f"the board serves {served}, expected 1.0.0")
    return {"deploy": {k: entry.get(k) for k in ("status", "version", "seconds", "reason") if k in entry},
            "served": served}


def check_infer_fp32(ctx: SuiteContext) -> dict[str, Any]:
    """tritonclient through the forwarded port: tensor input == FP32 ONNX Runtime here; image input
    through the daemon's pre-processing (the board's kernels) == this machine's reference."""
    import tritonclient.http as httpclient

    from cuvil_edge.daemon.pipeline import Pipeline
    from cuvil_edge.runtime.base import TensorSpec
    from hil.bundles import MODEL_NAME, PREPROCESS, host_reference, make_model

    model = ctx.workdir / "bundles" / "hilnet.onnx"
    if not model.is_file():
        make_model(model)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 3, 16, 16)).astype(np.float32)
    img = rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)
    want_tensor = host_reference(model, {"input": x})
    pipe = Pipeline({"preprocess": PREPROCESS}, [TensorSpec("input", np.dtype(np.float32), (-1, 3, 16, 16))],
                    [TensorSpec("logits", np.dtype(np.float32), (-1, 10))])
    want_image = host_reference(model, {"input": pipe.preprocess_image(img)[None]})
    client = ctx.client()
    try:
        inp = httpclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        got_tensor = client.infer(MODEL_NAME, [inp]).as_numpy("logits")
        inp = httpclient.InferInput("image", list(img.shape), "UINT8")
        inp.set_data_from_numpy(img, binary_data=True)
        got_image = client.infer(MODEL_NAME, [inp]).as_numpy("logits")
    finally:
        client.close()
    err_t = float(np.max(np.abs(got_tensor - want_tensor)))
    err_i = float(np.max(np.abs(got_image - want_image)))
    _expect(np.allclose(got_tensor, want_tensor, rtol=1e-4, atol=1e-5),
            f"board logits differ from FP32 ONNX Runtime on the host by up to {err_t:.3g}")
    _expect(np.allclose(got_image, want_image, rtol=1e-3, atol=1e-3),
            f"board logits for the image input differ from the host reference by up to {err_i:.3g}")
    # The daemon says which ISA its pre-processing kernels dispatched to (once per process).
    journal = ctx.board.ssh(["journalctl", "-u", UNIT, "--no-pager", "-o", "cat"], check=False).stdout
    lines = [ln for ln in journal.splitlines() if "pre-processing kernels:" in ln]
    _expect(bool(lines), "the daemon never logged its pre-processing kernels (numpy fallback?)")
    daemon_isa = dict(kv.split("=", 1) for kv in lines[-1].split("pre-processing kernels:", 1)[1].split())
    ctx.info["daemon_kernels_isa"] = daemon_isa
    # The unit refuses sched_setaffinity (SystemCallFilter=~@resources): ONNX Runtime must not try
    # to pin its threads (one error line per thread and session otherwise).
    pinned = [ln for ln in journal.splitlines() if "pthread_setaffinity_np" in ln]
    _expect(not pinned, f"ONNX Runtime tried to pin threads under the unit: {pinned[0][:240] if pinned else ''}")
    want = _expected_isa(ctx)
    _expect(daemon_isa.get("resize_normalize") == want,
            f"the daemon's resize_normalize ran {daemon_isa.get('resize_normalize')}, expected {want}")
    return {"max_abs_err_tensor": err_t, "max_abs_err_image": err_i, "daemon_isa": daemon_isa}


def check_top_over_ssh(ctx: SuiteContext) -> dict[str, Any]:
    """``cuvil-edge top --ssh`` reaches the board's daemon through deploy's SSH forward (the daemon's
    loopback port, not the port QEMU forwards) and shows the model row and the memory line."""
    b = ctx.board
    args = ["top", "--ssh", f"{b.user}@{b.host}:{b.ssh_port}", "--daemon-port", str(DAEMON_PORT), "--once",
            "--interval", "1"]
    if b.key is not None:
        args += ["--identity", str(b.key)]
    if b.known_hosts is not None:
        args += ["--known-hosts", str(b.known_hosts)]
    res = ctx.cli(*args, timeout=300)
    out = res.stdout
    _expect(res.returncode == 0, f"top --ssh exited {res.returncode}: {(res.stderr or out).strip()[-600:]}")
    from hil.bundles import MODEL_NAME

    rows = [ln for ln in out.splitlines() if MODEL_NAME in ln]
    memory = [ln for ln in out.splitlines() if "budget" in ln.lower()]
    _expect(bool(rows), f"top --ssh shows no row for {MODEL_NAME}:\n{out[-1500:]}")
    _expect(bool(memory), f"top --ssh shows no memory budget line:\n{out[-1500:]}")
    return {"model_row": " ".join(rows[0].split()), "memory_line": " ".join(memory[0].split())}


def check_identity(ctx: SuiteContext) -> dict[str, Any]:
    """``cuvil-edge status`` probes the board: architecture, and the personality's Jetson identity."""
    res = ctx.cli("status", *ctx.device_args(), "--json")
    _expect(res.returncode == 0, f"status exited {res.returncode}: {(res.stderr or res.stdout).strip()[-600:]}")
    text = res.stdout
    _expect('"aarch64"' in text, f"status does not report aarch64: {text[:400]}")
    board = ctx.board.target.board
    if board:
        from cuvil_edge.targets import get_target
        from hil.personality import PERSONALITIES

        release = next(r for r in get_target(board).releases if r.jetpack == PERSONALITIES[board].jetpack)
        facts = (json.loads(text)[0] if text.lstrip().startswith("[") else json.loads(text)).get("facts") or {}
        # The probe's reading of the board: the module from the device tree and RAM, L4T from
        # nv_tegra_release, TensorRT from the dpkg database (the apt packages dpkg installed).
        _expect(facts.get("profile") == board, f"status reports profile {facts.get('profile')}, not {board}")
        _expect((facts.get("l4t"), facts.get("tensorrt")) == (release.l4t, release.tensorrt),
                f"status reports L4T {facts.get('l4t')} TensorRT {facts.get('tensorrt')}, expected "
                f"{release.l4t} / {release.tensorrt} (JetPack {release.jetpack})")
    model = ctx.board.ssh("tr -d '\\0' < /proc/device-tree/model", check=False).stdout.strip()
    return {"device_tree_model": model, "profile_expected": board or "generic-arm64"}


def _metrics(ctx: SuiteContext) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{ctx.board.port(DAEMON_PORT)}/metrics", timeout=60) as r:
        return str(r.read().decode())


def _gauge(text: str, name: str) -> tuple[float | None, str]:
    """The first sample of a Prometheus gauge: (value, labels)."""
    m = re.search(rf"^{name}(\{{[^}}]*\}})? ([0-9.eE+-]+)$", text, re.M)
    return (float(m.group(2)), m.group(1) or "") if m else (None, "")


def check_tegrastats(ctx: SuiteContext) -> dict[str, Any]:
    """The daemon's scheduler on the Jetson personality: telemetry from tegrastats, a memory budget
    that fits the board's RAM, with PSI absent (L4T 36 has no CONFIG_PSI), and the model served."""
    if not ctx.board.target.board:
        raise CheckSkipped("no Jetson personality on this target (use qemu-orin-nano)")
    deadline = time.monotonic() + 120
    text, source, budget, total = "", "", None, None
    while time.monotonic() < deadline:
        text = _metrics(ctx)
        _up, labels = _gauge(text, "cuvil_telemetry_source_up")
        source = labels
        budget, _ = _gauge(text, "cuvil_memory_budget_bytes")
        total, _ = _gauge(text, "cuvil_memory_total_bytes")
        if "tegrastats" in source and budget:
            break
        time.sleep(2)
    mem_kb = int(ctx.board.ssh("sed -n 's/^MemTotal: *\\([0-9]*\\) kB/\\1/p' /proc/meminfo").stdout.strip())
    psi = ctx.board.ssh("test -e /proc/pressure/memory && echo present || echo absent").stdout.strip()
    if "tegrastats" not in source:
        journal = ctx.board.ssh(["journalctl", "-u", UNIT, "--no-pager", "-o", "cat"], check=False).stdout
        why = [ln for ln in journal.splitlines() if "telemetry" in ln.lower()][-4:]
        raise CheckFailed(f"the daemon's telemetry source is {source!r}, not tegrastats: {why}")
    _expect(total is not None and abs(total - mem_kb * 1024) < 0.05 * mem_kb * 1024,
            f"the scheduler's board RAM is {total} bytes, the board has {mem_kb} kB")
    _expect(budget is not None and budget >= 256 * (1 << 20),
            f"the scheduler's memory budget is {budget} bytes on a {mem_kb // 1024} MiB board (PSI {psi})")
    from hil.bundles import MODEL_NAME

    served = ctx.served_version(timeout=60)
    return {"source": source, "budget_mib": round((budget or 0) / (1 << 20)), "ram_mib": mem_kb // 1024,
            "psi": psi, "model": MODEL_NAME, "served": served}


def _trt_bundle(ctx: SuiteContext) -> Path:
    """The suite's model in the TensorRT form of the board's profile (build plans, no engine)."""
    if "trt" not in ctx.bundles:
        from hil.bundles import make_suite_bundle

        ctx.bundles["trt"] = make_suite_bundle(ctx.workdir / "bundles" / "hiltrt-1.0.0.cvb", ctx.keys()[0], "1.0.0",
                                               target=str(ctx.board.target.board), name=TRT_MODEL)
    return ctx.bundles["trt"]


def _trt_config(ctx: SuiteContext, timeout: float = 180) -> dict[str, Any]:
    """``/v2/models/<TRT_MODEL>/config`` once the model is ready."""
    import urllib.error
    import urllib.request

    base = f"http://127.0.0.1:{ctx.board.port(DAEMON_PORT)}/v2/models/{TRT_MODEL}"
    deadline, last = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(base + "/ready", timeout=30) as r:
                if r.status == 200:
                    with urllib.request.urlopen(base + "/config", timeout=30) as c:
                        return dict(json.loads(c.read()))
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        time.sleep(2)
    raise CheckFailed(f"{TRT_MODEL} not ready within {timeout:.0f} s ({last})")


def _restart_daemon(ctx: SuiteContext) -> None:
    ctx.board.ssh(["systemctl", "daemon-reload"])
    ctx.board.ssh(["systemctl", "restart", UNIT], timeout=300)
    ctx.wait_unit("active", "running", timeout=300)


def check_l4t_engine(ctx: SuiteContext) -> dict[str, Any]:
    """A TensorRT-form bundle on the L4T board: deploy serves it with ONNX Runtime, ``engine build
    --on`` builds its engine on the board (stand-in builder) and the daemon serves it through the
    engine stand-in, whose CUDA-init stand-in opens every GPU node under the shipped unit; the same
    unit without ``DeviceAllow=/dev/host1x-fence`` makes CUDA's init fail and the engine fall back."""
    if not ctx.board.target.board:
        raise CheckSkipped("no Jetson personality on this target (use qemu-orin-nano)")
    bundle = _trt_bundle(ctx)
    res = ctx.cli("deploy", str(bundle), *ctx.device_args(), "--pub", str(ctx.keys()[1]), "--health-timeout", "240",
                  "--confirm-deadline", "300", "--connect-timeout", "30", "--json")
    _expect(res.returncode == 0, f"deploy of the TensorRT-form bundle exited {res.returncode}: "
                                 f"{(res.stderr or res.stdout).strip()[-600:]}")
    before = _trt_config(ctx)
    _expect(before.get("backend") == "onnxruntime", f"before any engine the daemon serves {before.get('backend')}")
    b = ctx.board
    args = ["engine", "build", "--on", f"{b.user}@{b.host}:{b.ssh_port}", "--pub", str(ctx.keys()[1]),
            "--builder", "standin", "--daemon-port", str(DAEMON_PORT), "--json"]
    args += ["--identity", str(b.key)] if b.key is not None else []
    args += ["--known-hosts", str(b.known_hosts)] if b.known_hosts is not None else []
    built = ctx.cli(*args, str(bundle), timeout=900, env={"CUVIL_EDGE_ENGINE_CACHE": str(ctx.workdir / "engines")})
    _expect(built.returncode == 0, f"engine build --on exited {built.returncode}: "
                                   f"{(built.stderr or built.stdout).strip()[-800:]}")
    outcome = json.loads(built.stdout)[0]
    _expect(outcome.get("status") == "built" and outcome.get("reloaded"), f"engine build --on: {outcome}")
    served = _trt_config(ctx)
    _expect(served.get("backend") == "tensorrt-standin",
            f"after the build the daemon serves {served.get('backend')}: {served.get('engine')}")
    from cuvil_edge.runtime.cuda_standin import L4T36_CUDA_NODES

    journal = b.ssh(["journalctl", "-u", UNIT, "--no-pager", "-o", "cat"], check=False).stdout
    opened = [ln for ln in journal.splitlines() if "CUDA-init STAND-IN opened" in ln]
    _expect(bool(opened) and all(n in opened[-1] for n in L4T36_CUDA_NODES),
            f"the daemon did not open every GPU node under the unit: {opened[-1:] or 'no CUDA-init line'}")
    # Negative: the same unit without host1x-fence (the unit before #23) must make this check fail.
    from cuvil_edge.deploy.install import default_unit

    allow = [ln for ln in default_unit().decode().splitlines()
             if ln.startswith("DeviceAllow=") and "host1x-fence" not in ln]
    dropin = f"{DROPIN_DIR}/zz-no-host1x-fence.conf"
    b.ssh(f"cat > {dropin}", input="[Service]\nDeviceAllow=\n" + "\n".join(allow) + "\n")
    try:
        _restart_daemon(ctx)
        refused = _trt_config(ctx)
    finally:
        b.ssh(["rm", "-f", dropin])
        _restart_daemon(ctx)
    reason = str((refused.get("engine") or {}).get("reason", ""))
    _expect(refused.get("backend") == "onnxruntime" and "host1x-fence" in reason,
            f"without DeviceAllow=/dev/host1x-fence the daemon served {refused.get('backend')} ({reason[:300]})")
    again = _trt_config(ctx)
    _expect(again.get("backend") == "tensorrt-standin", f"with the shipped unit back: {again.get('backend')}")
    return {"engine_key": served.get("engine_key"), "build_seconds": outcome.get("seconds"),
            "opened": opened[-1].split("opened", 1)[1].split(), "without_host1x_fence": reason[:200]}


def check_deploy_upgrade(ctx: SuiteContext) -> dict[str, Any]:
    """An upgrade (1.0.0 -> 1.1.0) over SSH passes its gate; the daemon serves the new version."""
    rc, entry = ctx.deploy("v2")
    _expect(rc == 0, f"deploy of 1.1.0 exited {rc}: {entry}")
    served = ctx.served_version()
    _expect(served == "1.1.0", f"the board serves {served}, expected 1.1.0")
    return {"deploy": {k: entry.get(k) for k in ("status", "version", "seconds") if k in entry}, "served": served}


def _load(ctx: SuiteContext, stop: threading.Event, stats: dict[str, Any]) -> None:
    """Sends requests until ``stop``; counts successes per served version and failures."""
    import tritonclient.http as httpclient

    from hil.bundles import MODEL_NAME

    x = np.ones((1, 3, 16, 16), np.float32)
    client = ctx.client()
    try:
        while not stop.is_set():
            inp = httpclient.InferInput("input", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=True)
            try:
                res = client.infer(MODEL_NAME, [inp])
                v = res.get_response().get("model_version", "?")
                stats["versions"][v] = stats["versions"].get(v, 0) + 1
            except Exception as exc:  # every failure counts; the checks judge the kind
                status = getattr(exc, "status", lambda: None)() if hasattr(exc, "status") else None
                kind = f"http {status}" if status else "connection"
                stats["failed"] += 1
                stats["errors"].append(f"{kind}: {type(exc).__name__}: {str(exc)[:200]}")
                if stats.get("stop_on_refused") and kind == "connection":
                    break
    finally:
        client.close()


def check_reload_swap(ctx: SuiteContext) -> dict[str, Any]:
    """``systemctl reload`` (SIGHUP) swaps the served version under load without a failed request."""
    from hil.bundles import MODEL_NAME

    before = ctx.served_version()
    other = "1.0.0" if before == "1.1.0" else "1.1.0"
    stats: dict[str, Any] = {"versions": {}, "failed": 0, "errors": []}
    stop = threading.Event()
    worker = threading.Thread(target=_load, args=(ctx, stop, stats), daemon=True)
    worker.start()
    try:
        time.sleep(3)
        store = f"/var/lib/cuvil-edge/bundles/{MODEL_NAME}"
        ctx.board.ssh(f"cd {store} && ln -sfn {other} current.hil && mv -T current.hil current")
        ctx.board.ssh(["systemctl", "reload", UNIT])
        deadline = time.monotonic() + 120
        while stats["versions"].get(other, 0) < 20 and time.monotonic() < deadline and worker.is_alive():
            time.sleep(0.5)
    finally:
        stop.set()
        worker.join(60)
    state = ctx.unit_state()
    _expect(stats["failed"] == 0, f"{stats['failed']} requests failed during the reload: {stats['errors'][:3]}")
    _expect(stats["versions"].get(other, 0) >= 20, f"the reload did not swap to {other}: {stats['versions']}")
    _expect(state["ActiveState"] == "active" and state["SubState"] == "running", f"unit after reload: {state}")
    return {"from": before, "to": other, "requests": stats["versions"], "failed": stats["failed"]}


def check_deploy_rollback(ctx: SuiteContext) -> dict[str, Any]:
    """A bundle whose health gate fails on the board is rolled back; the previous version serves."""
    before = ctx.served_version()
    rc, entry = ctx.deploy("bad")
    _expect(rc != 0, f"deploy of the bad bundle exited 0: {entry}")
    status = str(entry.get("status", ""))
    _expect("roll" in status or "fail" in status, f"deploy status {status!r}, expected a rollback")
    served = ctx.served_version()
    _expect(served == before, f"after the failed gate the board serves {served}, expected {before}")
    current = ctx.board.ssh("readlink /var/lib/cuvil-edge/bundles/hilnet/current").stdout.strip()
    _expect(current == before, f"current -> {current}, expected {before}")
    return {"status": status, "reason": str(entry.get("reason", ""))[:300], "served": served, "exit": rc}


def check_security(ctx: SuiteContext) -> dict[str, Any]:
    """``systemd-analyze security`` on the board rates the unit's exposure."""
    res = ctx.board.ssh(["systemd-analyze", "security", "--no-pager", UNIT], check=False, timeout=300)
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+) (\S+)", res.stdout)
    _expect(m is not None, f"systemd-analyze security printed no exposure: {(res.stdout + res.stderr)[-400:]}")
    assert m is not None
    exposure, label = float(m.group(1)), m.group(2)
    ctx.info["security_exposure"] = f"{exposure} {label}"
    _expect(exposure <= 5.0, f"exposure {exposure} {label}: the hardening regressed")
    return {"exposure": exposure, "label": label}


def check_watchdog(ctx: SuiteContext) -> dict[str, Any]:
    """A stalled event loop (debug fault hook) is killed by the watchdog and restarted by systemd."""
    before = int(ctx.unit_state().get("NRestarts", "0") or 0)
    t0 = time.monotonic()
    ctx.board.ssh(["systemctl", "kill", "--kill-who=main", "-s", "SIGUSR2", UNIT])
    state = ctx.wait_unit("active", "running", timeout=WATCHDOG_SEC + 240, since_restarts=before)
    seconds = round(time.monotonic() - t0, 1)
    journal = ctx.board.ssh(["journalctl", "-u", UNIT, "--no-pager", "-o", "cat"], check=False).stdout
    _expect("Watchdog timeout" in journal or "watchdog" in journal.lower(),
            "the journal does not show a watchdog timeout")
    ctx.served_version()
    return {"restarts": int(state["NRestarts"]), "back_in_seconds": seconds}


def check_stop_drains(ctx: SuiteContext) -> dict[str, Any]:
    """``systemctl stop`` drains: in-flight requests finish, the daemon exits 0, no request breaks."""
    stats: dict[str, Any] = {"versions": {}, "failed": 0, "errors": [], "stop_on_refused": True}
    stop = threading.Event()
    worker = threading.Thread(target=_load, args=(ctx, stop, stats), daemon=True)
    worker.start()
    time.sleep(3)
    t0 = time.monotonic()
    ctx.board.ssh(["systemctl", "stop", UNIT], timeout=180)
    stop_s = round(time.monotonic() - t0, 1)
    stop.set()
    worker.join(60)
    state = ctx.unit_state()
    journal = ctx.board.ssh(["journalctl", "-u", UNIT, "--no-pager", "-o", "cat", "-n", "40"], check=False).stdout
    served = sum(stats["versions"].values())
    _expect(served > 0, "no request succeeded before the stop")
    _expect(state["Result"] == "success", f"stop result {state['Result']} (exit {state['ExecMainStatus']})")
    _expect("draining" in journal.lower(), "the daemon did not log that it drains")
    # Once the listener closed, the next request cannot connect (a connection error); a request
    # the daemon had accepted must not end in an HTTP error.
    broken = [e for e in stats["errors"] if not e.startswith("connection")]
    _expect(not broken, f"requests broke during the drain: {broken[:3]}")
    ctx.board.ssh(["systemctl", "start", UNIT], timeout=300)
    ctx.wait_unit("active", "running", timeout=300)
    return {"served_before_stop": served, "stop_seconds": stop_s, "result": state["Result"],
            "connection_errors_after_close": len(stats["errors"])}


# ---------------------------------------------------------------------- power cuts

STORE = "/var/lib/cuvil-edge"
PAUSE_DIR = "/run/cuvil-hil-pause"  # tmpfs: a boot after a cut never finds a pause flag
CUT_HEALTH_TIMEOUT = 90
CUT_DEADLINE = 150  # the confirm deadline of the cut deploys: the board must be right within it
# The daemon refuses a bundle that fails its own sample at load (it warms up with it) and says so
# at ERROR: what a check that deploys the failing-gate bundle on purpose causes.
BAD_GATE_ERROR = r"loading model hilnet failed: hilnet [0-9.]+: output 'logits' on the bundle's sample differs"


@dataclass(frozen=True)
class Cut:
    """One power cut: where (a pause point of the device step, or a moment the rig times), what runs."""

    name: str
    where: str
    action: str  # deploy | deploy-bad | rollback | reload | upload | deployed
    step: str | None = None  # the device step's pause point (``_test_hooks.pause``)
    padding: int = 0
    expect_new: bool = False  # the new version must serve after the cut (it was confirmed before it)
    expected_errors: tuple[str, ...] = ()


CUTS: tuple[Cut, ...] = (
    Cut("upload", "during the upload: the board's sftp-server frozen with a partial .part on disk",
        "upload", padding=24 << 20),
    Cut("extract", "during extract: tar wrote every file, none fsynced yet", "deploy", "extract", padding=8 << 20),
    Cut("before-switch", "between extract and switch: version installed, pending recorded, current not switched",
        "deploy", "before-switch"),
    Cut("after-switch", "after the switch: current names the new version, not yet gated", "deploy", "after-switch"),
    Cut("gate", "during the health gate: the daemon serves the new version, unconfirmed", "deploy", "gate"),
    Cut("gate-failing", "during the health gate of a bundle whose gate fails", "deploy-bad", "gate",
        expected_errors=(BAD_GATE_ERROR,)),
    Cut("outcome", "while the outcome is written: the new state file fsynced, not yet renamed", "deploy",
        "outcome"),
    Cut("outcome-failing", "while a rolled-back outcome is written (current already switched back)", "deploy-bad",
        "outcome", expected_errors=(BAD_GATE_ERROR,)),
    Cut("prune", "during a prune: an old version moved out of bundles/, its files not yet deleted", "deploy",
        "prune"),
    Cut("deployed", "just after a deploy confirmed (its outcome on disk)", "deployed", expect_new=True),
    Cut("rollback", "after the switch of `cuvil-edge rollback`, before its gate", "rollback", "after-switch"),
    Cut("reload", "during a daemon reload (systemctl reload, SIGHUP)", "reload"),
)


def _device_tool(ctx: SuiteContext) -> str:
    """``cuvil-edge-device`` beside the unit's ``cuvil-edged`` (``/usr/local/bin`` or a venv's ``bin``)."""
    if "device_tool" not in ctx.info:
        out = ctx.board.ssh(["systemctl", "show", "-p", "ExecStart", "--value", UNIT], check=False).stdout
        m = re.search(r"path=(\S+?)/cuvil-edged\b", out) or re.search(r"(\S+?)/cuvil-edged\b", out)
        ctx.info["device_tool"] = f"{m.group(1) if m else '/usr/local/bin'}/cuvil-edge-device"
    return str(ctx.info["device_tool"])


def _store_json(ctx: SuiteContext, *args: str) -> dict[str, Any]:
    from hil.bundles import MODEL_NAME

    res = ctx.board.ssh([_device_tool(ctx), *args, "--store", STORE, "--name", MODEL_NAME], check=False,
                        timeout=300)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise CheckFailed(f"cuvil-edge-device {args[0]} printed no JSON (exit {res.returncode}): "
                          f"{(res.stderr or res.stdout).strip()[-400:]}")
    return dict(json.loads(lines[-1]))


SUDO_KEEP_PAUSE = "/etc/sudoers.d/90-cuvil-hil-pause"


def _prepare_cuts(ctx: SuiteContext) -> None:
    """Once per boot: the pause hook's variable for the rig's root sessions, so only the deploy step
    of this rig's sessions can pause and the daemon's unit never sees it. The login's sessions get
    it from /etc/environment (pam_env in sshd's PAM stack); ``sudo`` resets the environment, so a
    sudoers drop-in keeps this one variable (``env_keep``) for the root steps run through it."""
    ctx.board.ssh(f"grep -q CUVIL_EDGE_TEST_PAUSE_DIR /etc/environment || "
                  f"{{ echo CUVIL_EDGE_TEST_PAUSE_DIR={PAUSE_DIR} >> /etc/environment; sync /etc/environment; }}; "
                  f"mkdir -p {PAUSE_DIR}")
    if ctx.board.user != "root":
        keep = 'Defaults env_keep += "CUVIL_EDGE_TEST_PAUSE_DIR"\n'
        # Checked by content, written durably: a power cut right after the first write leaves an
        # empty file behind, which sudo reads as no rule at all.
        ctx.board.ssh(f"grep -qs CUVIL_EDGE_TEST_PAUSE_DIR {SUDO_KEEP_PAUSE} || {{ printf '%s' {shlex.quote(keep)} "
                      f"> {SUDO_KEEP_PAUSE}.tmp && chmod 0440 {SUDO_KEEP_PAUSE}.tmp && visudo -cqf "
                      f"{SUDO_KEEP_PAUSE}.tmp && sync {SUDO_KEEP_PAUSE}.tmp && mv {SUDO_KEEP_PAUSE}.tmp "
                      f"{SUDO_KEEP_PAUSE} && sync /etc/sudoers.d; }}")
    seen = ctx.board.ssh("echo $CUVIL_EDGE_TEST_PAUSE_DIR").stdout.strip()
    _expect(seen == PAUSE_DIR, f"root's sessions (sudo) do not get the pause hook's variable "
                               f"(/etc/environment, {SUDO_KEEP_PAUSE}; got {seen!r}): the cuts could not land "
                               f"at their points")


def _wait_board(ctx: SuiteContext, test: str, timeout: float, what: str, proc: subprocess.Popen[str] | None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ctx.board.ssh(test, check=False, timeout=60).returncode == 0:
            return
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise CheckFailed(f"the host's command ended (exit {proc.returncode}) before {what}: {out[-600:]}")
        time.sleep(0.3)
    raise CheckFailed(f"{what} did not happen within {timeout:.0f} s")


def _host_cmd(ctx: SuiteContext, cut: Cut, version: str, report: Path) -> list[str]:
    from hil.bundles import MODEL_NAME

    common = [*ctx.device_args(), "--health-timeout", str(CUT_HEALTH_TIMEOUT), "--confirm-deadline",
              str(CUT_DEADLINE), "--connect-timeout", "30", "--json"]
    if cut.action == "rollback":
        return [sys.executable, "-m", "cuvil_edge.cli", "rollback", MODEL_NAME, *common]
    bundle = ctx.cut_bundle(version, bad_gate=cut.action == "deploy-bad", padding=cut.padding)
    return [sys.executable, "-m", "cuvil_edge.cli", "deploy", str(bundle), "--pub", str(ctx.keys()[1]),
            "--report", str(report), *common]


def check_power_cut(ctx: SuiteContext, cut: Cut) -> dict[str, Any]:
    """Cut the power at ``cut``, boot from the same disk: the board serves a gated, verified version."""
    b = ctx.board
    if not b.emulated:
        raise CheckSkipped("power cuts need the emulated board (SIGKILL of QEMU)")
    _prepare_cuts(ctx)
    n = CUTS.index(cut)
    version = f"1.{20 + n}.0"
    before = ctx.served_version()
    report = ctx.workdir / f"cut-{cut.name}.json"
    b.ssh(f"rm -f {PAUSE_DIR}/*; " + (f"touch {PAUSE_DIR}/{cut.step}.pause" if cut.step else "true"))
    proc = None
    observed = ""
    if cut.action == "reload":
        b.ssh(["systemctl", "reload", UNIT])
        time.sleep(0.3)
        observed = "systemctl reload returned; the daemon re-reads the store"
    else:
        argv = _host_cmd(ctx, cut, version, report)
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
                                stdin=subprocess.DEVNULL)
        if cut.action == "upload":
            # Freeze the board's SFTP server as soon as a partial upload is on disk.
            watch = (f"while ! ls {STORE}/deploy/uploads/*.part >/dev/null 2>&1; do sleep 0.05; done; "
                     "kill -STOP $(pgrep -n sftp-server); sleep 0.5; "
                     f"stat -c %s {STORE}/deploy/uploads/*.part")
            out = b.ssh(["timeout", "300", "sh", "-c", watch], check=False, timeout=330)
            if out.returncode != 0:
                raise CheckFailed(f"no partial upload appeared on the board: {out.stderr[-300:]}")
            observed = f"partial upload of {out.stdout.strip()} bytes on disk"
        elif cut.action == "deployed":
            try:
                proc.wait(600)
            except subprocess.TimeoutExpired:
                raise CheckFailed("the deploy did not finish within 600 s") from None
            observed = f"deploy exited {proc.returncode}"
        else:
            _wait_board(ctx, f"test -e {PAUSE_DIR}/{cut.step}.reached", 600, f"the device step reaching {cut.step}",
                        proc)
            observed = f"device step paused at {cut.step}"
    current_at_cut = b.ssh(f"readlink {STORE}/bundles/hilnet/current", check=False).stdout.strip()
    if ctx.workdir_run is not None:
        from hil.runner import board_journal

        (ctx.workdir_run / f"journal-boot{b.power_cuts}.txt").write_text(board_journal(b))
    from hil.runner import daemon_error_lines

    ctx.journal_errors.extend(daemon_error_lines(b))
    b.power_cut()
    t_cut = time.monotonic()
    boot_s = b.power_on()
    state = ctx.wait_unit("active", "running", timeout=600)
    served = ctx.served_version(timeout=300)
    seconds_to_serve = round(time.monotonic() - t_cut, 1)
    verify = _store_json(ctx, "verify")
    host: dict[str, Any] = {}
    if proc is not None:
        try:
            proc.wait(CUT_DEADLINE + 90)
        except subprocess.TimeoutExpired:
            proc.kill()  # our own child; its result no longer matters
            proc.wait(30)
            host["note"] = "the host's command was still reconnecting; stopped"
        host["exit"] = proc.returncode
        if report.is_file():
            data = json.loads(report.read_text())
            entry = (data.get("devices") or data.get("results") or [{}])[0]
            host.update({k: entry.get(k) for k in ("status", "stage", "version", "serving", "reason")})
    details = {"where": cut.where, "observed": observed, "current_at_cut": current_at_cut, "before": before,
               "new": version if cut.action not in ("reload", "rollback") else None, "served_after": served,
               "boot_seconds": boot_s, "seconds_cut_to_serving": seconds_to_serve,
               "unit": f"{state.get('ActiveState')}/{state.get('SubState')}",
               "state_file": {k: verify.get(k) for k in ("version", "files_ok", "healthy", "pending", "reason")},
               "host": host}
    want = version if cut.expect_new else before
    _expect(served == want, f"after the cut {cut.where!r} the board serves {served}, expected {want}: {details}")
    _expect(verify.get("version") == served, f"current names {verify.get('version')}, the daemon serves {served}")
    _expect(bool(verify.get("files_ok")), f"{served}'s files do not verify: {verify.get('reason')}")
    _expect(bool(verify.get("healthy")) and not verify.get("pending"),
            f"the state file does not name {served} healthy with nothing pending: {verify}")
    _expect(seconds_to_serve < CUT_DEADLINE + boot_s,
            f"{seconds_to_serve} s from the cut to serving, past the {CUT_DEADLINE} s deadline after the boot")
    if host.get("status") == "deployed":
        _expect(served == version, f"the host reported deployed {version}, the board serves {served}")
    elif host.get("status") == "rolled-back":
        _expect(served != version, f"the host reported rolled-back, the board serves {version}")
    return details


@dataclass(frozen=True)
class Check:
    name: str
    fn: Callable[[SuiteContext], dict[str, Any]]
    smoke: bool
    expected_errors: tuple[str, ...] = ()  # regexes of daemon ERROR lines this check causes on purpose
    powercut: bool = False  # part of the powercut suite (and of full)


CHECKS: tuple[Check, ...] = (
    Check("boot", check_boot, True),
    Check("login_sudo_user", check_login_user, True),
    Check("install_project", check_install_project, True),
    Check("kernels_isa", check_kernels, True),
    Check("install_daemon_ready", check_install_daemon, True),
    Check("deploy_fresh", check_deploy_fresh, True),
    Check("infer_equals_fp32", check_infer_fp32, True),
    Check("top_over_ssh", check_top_over_ssh, True),
    Check("board_identity", check_identity, False),
    Check("tegrastats_standin", check_tegrastats, False),
    Check("l4t_engine_gpu_nodes", check_l4t_engine, False),
    Check("deploy_upgrade", check_deploy_upgrade, False),
    Check("reload_swap", check_reload_swap, False),
    Check("deploy_failing_gate_rollback", check_deploy_rollback, False, expected_errors=(BAD_GATE_ERROR,)),
    Check("security_exposure", check_security, False),
    Check("watchdog_restart", check_watchdog, False,
          expected_errors=(r"debug fault hook: SIGUSR2 received, stalling the event loop",)),
    Check("stop_drains", check_stop_drains, False),
    *(Check(f"powercut[{c.name}]", functools.partial(check_power_cut, cut=c), False,
            expected_errors=c.expected_errors, powercut=True) for c in CUTS),
)
SUITES = ("smoke", "full", "powercut", "boot")
# The powercut suite's prerequisites: a board with the daemon installed and one version deployed.
POWERCUT_BASE = ("boot", "install_project", "install_daemon_ready", "deploy_fresh")


def checks_for(suite: str) -> list[Check]:
    """The checks of ``smoke``, ``full``, ``powercut`` or ``boot`` (boot only: the fallback proof), in order."""
    if suite == "full":
        return list(CHECKS)
    if suite == "smoke":
        return [c for c in CHECKS if c.smoke]
    if suite == "powercut":
        return [c for c in CHECKS if c.name in POWERCUT_BASE or c.powercut]
    if suite == "boot":
        return [CHECKS[0]]
    raise HilError(f"unknown suite '{suite}'; use {', '.join(SUITES)}")
