"""The device side of an engine build: plan + model -> ``<store>/engines/<key>/<model sha256>.plan``.

``cuvil-edge engine build --plan P --onnx M --store S`` runs this on the board (the host starts
it over SSH, :mod:`cuvil_edge.deploy.engines`). It

1. reads the board's own facts below ``--root`` (L4T, TensorRT, board profile -> module and SM)
   and derives its engine key from them and the plan
   (:func:`~cuvil_edge.bundle.engine_store.key_for_facts`); refuses a plan made for another
   TensorRT version, SM or DLA core, and a model whose sha256 is not the plan's;
2. makes itself a process group leader and prints ``pid``/``pgid`` first, so the host can stop
   the whole build (this process and the builder it runs) with one ``kill -TERM -- -PGID``;
3. runs the builder as a child process in that group: TensorRT through ``cuvil-edge engine build
   --out`` (``--builder tensorrt``), or the stand-in builder executable (``--builder standin``,
   :mod:`cuvil_edge.packager.engine_standin`, for machines without TensorRT), printing every
   builder log line as it comes (the host streams them);
4. stores plan, log and timing cache in the engine store, and the record last; prints the record
   as one ``CUVIL-ENGINE-RECORD {json}`` line.

A stopped or failed build leaves nothing in the store: the builder writes into a scratch
directory that is removed on the way out, and the record is written only after the plan.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from cuvil_edge.bundle.engine_plan import check_build_inputs, load_plan
from cuvil_edge.bundle.engine_store import (
    EngineError,
    EngineRecord,
    EngineStore,
    device_identity,
    key_for_facts,
    now_iso,
    plan_matches_device,
    sha256_bytes,
)
from cuvil_edge.errors import ModelError

__all__ = ["BUILDERS", "RECORD_PREFIX", "BuildStopped", "build_into_store"]

BUILDERS = ("tensorrt", "standin")
RECORD_PREFIX = "CUVIL-ENGINE-RECORD "


class BuildStopped(ModelError):
    """The build was stopped by a signal (the host's Ctrl-C); nothing was stored."""


def _on_term(signum: int, _frame: FrameType | None) -> None:
    raise BuildStopped(f"engine build stopped by signal {signal.Signals(signum).name}; nothing stored")


def build_into_store(
    plan_path: Path,
    onnx_path: Path,
    store_root: Path,
    root: str = "/",
    builder: str = "tensorrt",
    echo: Callable[[str], None] | None = None,
    standin_seconds: float = 2.0,
) -> EngineRecord:
    """Build the engine a plan describes for this device and put it in the device's engine store.

    Args:
        plan_path (Path): the build plan (``engine/plan-trt<ver>.json`` of the bundle).
        onnx_path (Path): the model the plan was made for.
        store_root (Path): the device's bundle store; engines go to ``<store_root>/engines``.
        root (str): system root whose facts give the key (``/`` on a board). Defaults to ``/``.
        builder (str): ``tensorrt`` (TensorRT in this process) or ``standin`` (the stand-in
            executable, for tests without TensorRT). Defaults to ``tensorrt``.
        echo (Callable[[str], None] | None): where log lines go. Defaults to stdout, flushed.
        standin_seconds (float): how long the stand-in builder takes. Defaults to 2 s.

    Returns:
        EngineRecord: the stored engine's record.

    Raises:
        EngineError: this device has no key, or the plan or model is not for it.
        BuildStopped: SIGTERM/SIGINT arrived; nothing was stored.
        ModelError: the builder failed (its last log line in the message).
    """
    from cuvil_edge.bundle.device_facts import probe_local

    say = echo or (lambda line: print(line, flush=True))
    if builder not in BUILDERS:
        raise ModelError(f"--builder {builder!r}: use one of {', '.join(BUILDERS)}")
    plan = load_plan(Path(plan_path))
    if plan.get("unresolved_inputs"):
        check_build_inputs(plan, Path(plan_path), Path(onnx_path))  # refused before probing the device
    dla = (plan.get("dla") or {}).get("core")
    facts = probe_local(root)
    trt_version = None
    if builder == "tensorrt":
        from cuvil_edge.runtime.trt import installed_tensorrt_version

        trt_version = installed_tensorrt_version()  # raises TensorRTMissing naming the extra
    device = device_identity(facts, trt_version)
    pkey = plan["engine_key"]
    if not plan_matches_device(plan, device, dla):
        raise EngineError(f"{plan_path}: plan is for TensorRT {pkey['tensorrt']} SM {pkey['sm']}, this device is "
                          f"{device.module} with TensorRT {device.tensorrt} SM {device.sm}; use the bundle's plan "
                          f"for TensorRT {device.tensorrt}")
    key = key_for_facts(facts, plan, trt_version)
    onnx_path = Path(onnx_path)
    model_sha = check_build_inputs(plan, Path(plan_path), onnx_path)
    store = EngineStore(Path(store_root) / "engines")
    scratch = store.root / ".build" / f"{model_sha[:16]}-{key.slug}-{os.getpid()}"
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)  # one group for this process and the builder: the host stops both at once
    say(f"cuvil-edge engine build: pid {os.getpid()} pgid {os.getpgrp()} key {key.slug} builder {builder}")
    old = {s: signal.signal(s, _on_term) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    lines: list[str] = []

    def log(line: str) -> None:
        lines.append(line)
        say(line)

    t0 = time.monotonic()
    try:
        scratch.mkdir(parents=True, exist_ok=True)
        out = scratch / "engine.plan"
        timing = scratch / "timing.cache"
        cached_timing = store.timing_cache_path(key)
        if cached_timing.is_file():
            shutil.copyfile(cached_timing, timing)
        if builder == "standin":
            _run_builder(_standin_argv(plan, onnx_path, out, timing, key.slug, key.tensorrt, standin_seconds),
                         out, log, "stand-in builder")
            version = "standin"
        else:
            # TensorRT builds in a child process: a SIGTERM must stop it at once, and Python signal
            # handlers do not run while build_serialized_network is inside TensorRT's C++ code.
            _run_builder([sys.executable, "-m", "cuvil_edge.cli", "engine", "build", "--plan", str(plan_path),
                          "--onnx", str(onnx_path), "--out", str(out), "--timing-cache", str(timing)],
                         out, log, "TensorRT builder")
            version = str(trt_version)
        data = out.read_bytes()
        log_bytes = ("\n".join(lines) + "\n").encode()
        record = EngineRecord(key=key, model_sha256=model_sha, plan_sha256=sha256_bytes(data), plan_size=len(data),
                              builder=builder, builder_version=version, builder_log_sha256=sha256_bytes(log_bytes),
                              precision=str(plan.get("precision", "")), plugins=list(plan.get("plugins") or []),
                              built_at=now_iso(), built_on=socket.gethostname())
        store.put(record, data, log_bytes, timing.read_bytes() if timing.is_file() else None)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        shutil.rmtree(scratch, ignore_errors=True)
        with contextlib.suppress(OSError):
            (store.root / ".build").rmdir()
    say(f"built {store.plan_path(key, model_sha)} ({record.plan_size} bytes) in {time.monotonic() - t0:.1f} s")
    import json

    say(RECORD_PREFIX + json.dumps(record.to_dict(), sort_keys=True))
    return record


def _standin_argv(plan: dict[str, Any], onnx: Path, out: Path, timing: Path, slug: str, tensorrt: str,
                  seconds: float) -> list[str]:
    """The stand-in builder's command line, as trtexec would be called for this plan."""
    argv = [sys.executable, "-m", "cuvil_edge.packager.engine_standin", f"--onnx={onnx}", f"--saveEngine={out}",
            f"--timingCacheFile={timing}", f"--memPoolSize=workspace:{int(plan['workspace']['bytes']) >> 20}M",
            f"--standin-tensorrt={tensorrt}", f"--standin-key={slug}", f"--standin-seconds={seconds}"]
    argv += [f"--{flag.lower()}" for flag in plan.get("builder_flags") or []]
    if plan.get("precision_mode") == "strongly_typed":
        argv.append("--stronglyTyped")
    return argv


def _run_builder(argv: list[str], out: Path, log: Callable[[str], None], what: str) -> None:
    """Run a builder executable in this process group, relaying its output lines as they come."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            text=True, bufsize=1)
    last = ""
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            last = line.rstrip("\n")
            log(last)
        code = proc.wait()
    except BaseException:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        raise
    finally:
        if proc.stdout is not None:
            proc.stdout.close()
    if code != 0 or not out.is_file():
        raise ModelError(f"{what} failed (exit {code}): {last}")
