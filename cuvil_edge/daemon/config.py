"""Settings of ``cuvil-edged``, from the command line and ``CUVIL_EDGED_<NAME>`` variables.

As uvicorn's ``config.py``: one :class:`Config` holds every setting; :func:`load` resolves them
from argv with the environment as the fallback (``--max-body-mb`` reads
``CUVIL_EDGED_MAX_BODY_MB``), validates, and raises :class:`DaemonError` with the option's name
and the fix. The option table :data:`OPTIONS` is the single source of names, types, defaults and
help; ``main.py`` builds the parser from it.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from cuvil_edge.daemon.grpc_cq import IO_MODES
from cuvil_edge.daemon.limits import Limits
from cuvil_edge.errors import DaemonError

__all__ = ["ENV_PREFIX", "OPTIONS", "Config", "build_parser", "load"]

ENV_PREFIX = "CUVIL_EDGED_"


def _bool(text: str) -> bool:
    low = str(text).strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _int_list(text: str) -> list[int]:
    return [int(p) for p in str(text).replace(" ", "").split(",") if p]


def _str_list(text: str) -> list[str]:
    return [p for p in str(text).replace(" ", "").split(",") if p]


@dataclass
class Config:
    """Every setting of the daemon; see :data:`OPTIONS` for the meaning of each field."""

    store: Path = Path("/var/lib/cuvil-edge")
    host: str = "127.0.0.1"
    port: int = 8000
    uds: Path | None = None
    grpc: bool = True
    grpc_port: int | None = None
    grpc_uds: Path | None = None
    grpc_max_message_mb: float | None = None
    grpc_max_streams: int = 100
    grpc_max_rpcs: int = 256
    grpc_io: str = "poller"
    shared_memory: bool = True
    token: str | None = None
    token_file: Path | None = None
    max_body_mb: float = 64.0
    models: list[str] = field(default_factory=list)
    pub: Path | None = None
    telemetry: str | None = None
    board: str | None = None
    device: str = "auto"
    root: str = "/"
    engine_standin: bool = False
    dla_core: int | None = None
    intra_op_threads: int = 0
    spin: bool = True
    max_batch: int | None = None
    preferred_batch: list[int] = field(default_factory=list)
    max_queue_delay_us: int = 0
    max_depth: int = 2
    inline_us: float = 300.0
    batch_autotune: bool = True
    warmup: bool = True
    page_out: bool = True
    scratch_idle_s: float = 1.0
    strict: bool = False
    memory_reserve_mb: int | None = None
    drain_timeout: float = 30.0
    keep_alive: float = 30.0
    request_timeout: float = 60.0
    max_connections: int = 512
    max_buffered_mb: float = 256.0
    max_json_mb: float = 16.0
    max_json_depth: int = 32
    max_pipeline: int = 8
    write_buffer_kb: int = 256
    max_header_kb: int = 64
    tick: float = 0.5
    log_level: str = "info"
    access_log: bool = False

    @property
    def max_body_bytes(self) -> int:
        """The request body limit in bytes."""
        return int(self.max_body_mb * 1024 * 1024)

    def limits(self) -> Limits:
        """What one client may cost: the bounds every front end (HTTP, gRPC) enforces."""
        return Limits(
            max_body=self.max_body_bytes,
            max_buffered=max(self.max_body_bytes, int(self.max_buffered_mb * 1048576)),
            max_json=int(self.max_json_mb * 1048576),
            max_json_depth=self.max_json_depth,
            max_connections=self.max_connections,
            max_pipeline=self.max_pipeline,
            write_high_water=self.write_buffer_kb * 1024,
            max_header=self.max_header_kb * 1024,
            keep_alive=self.keep_alive,
            request_timeout=self.request_timeout,
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain data (paths as strings); the token is masked."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = str(v) if isinstance(v, Path) else v
        if out.get("token"):
            out["token"] = "***"
        return out


# name -> (type converter, help). Defaults come from Config.
OPTIONS: dict[str, tuple[Any, str]] = {
    "store": (Path, "bundle store root (holds bundles/<name>/<version>/ and current links)"),
    "host": (str, "address to listen on (loopback unless you mean it)"),
    "port": (int, "TCP port"),
    "uds": (Path, "listen on this Unix socket instead of TCP"),
    "grpc": (_bool, "also serve KServe v2 gRPC (Triton's GRPCInferenceService); 0 turns it off"),
    "grpc_port": (int, "gRPC TCP port on --host (default 8001, Triton's; a free one with --port 0)"),
    "grpc_uds": (Path, "serve gRPC on this Unix socket instead (default with --uds: NAME-grpc.sock beside it)"),
    "grpc_max_message_mb": (float, "largest gRPC request message, MiB (default: --max-body-mb)"),
    "grpc_max_streams": (int, "HTTP/2 streams (calls) open at once per gRPC connection"),
    "grpc_max_rpcs": (int, "authenticated gRPC calls in progress at once (health calls apart); more get "
                      "RESOURCE_EXHAUSTED"),
    "grpc_io": (str, "poller | engine: which threads read and write gRPC's sockets: the transport's "
                "poller (two thread wake-ups fewer per call) or grpc core's EventEngine pool"),
    "shared_memory": (_bool, "serve Triton's system shared-memory extension (tensors in /dev/shm regions a "
                      "local client registers); 0 refuses every region"),
    "token": (str, "require 'Authorization: Bearer <token>' on every endpoint but /v2/health/*; "
              "prefer --token-file or the environment: a command line is readable in /proc by every user"),
    "token_file": (Path, "read the bearer token from this file (keep it mode 0600)"),
    "max_body_mb": (float, "largest request body accepted, MiB (larger: 413)"),
    "models": (_str_list, "comma-separated models to load at start (default: every model in the store)"),
    "pub": (Path, "minisign public key: verify each bundle before loading it"),
    "telemetry": (str, "telemetry source spec (e.g. sim:orin-nano-8gb, replay:FILE, tegrastats, auto)"),
    "board": (str, "board profile name (cuvil-edge targets) for the memory budget"),
    "device": (str, "auto | cpu | gpu: where backends run"),
    "root": (str, "system root whose facts (L4T, TensorRT, board) give this device's engine key"),
    "engine_standin": (_bool, "serve engines made by the STAND-IN builder (tests without TensorRT; they run "
                       "with ONNX Runtime and report backend tensorrt-standin)"),
    "dla_core": (int, "serve engines built for this DLA core (default: GPU engines)"),
    "intra_op_threads": (int, "threads per inference (0: runtime default)"),
    "spin": (_bool, "let ONNX Runtime's CPU threads spin between operators (its default): lower latency "
             "for models of several ms; 0 frees the cores between requests for other work"),
    "max_batch": (int, "cap every model's dynamic batch size (default: the manifest's max_batch)"),
    "preferred_batch": (_int_list, "comma-separated preferred batch sizes for the dynamic batcher"),
    "max_queue_delay_us": (int, "longest a request waits for a batch to fill, microseconds"),
    "max_depth": (int, "largest number of batches in flight per model (the prefetch bound)"),
    "inline_us": (float, "run a request on the event loop when the model is idle and takes less than "
                  "this many microseconds (0: always use the worker threads)"),
    "batch_autotune": (_bool, "at warm-up, cap dynamic batches below a size that costs clearly more per sample"),
    "warmup": (_bool, "run each model on its sample (or zeros) before it serves"),
    "page_out": (_bool, "after models load, drop the library pages loading read and only the daemon maps "
                 "(unmapped, then out of the page cache): less memory in use, the first requests read "
                 "back what they run; 0 keeps them"),
    "scratch_idle_s": (float, "seconds a model idles after batches larger than 1 before the runtime "
                       "gives their scratch (activations) back; the next burst allocates it again "
                       "(0: keep it)"),
    "strict": (_bool, "exit 3 when a model fails to load at start"),
    "memory_reserve_mb": (int, "RAM kept free for the system, MiB (default: the scheduler's)"),
    "drain_timeout": (float, "seconds SIGTERM waits for in-flight requests"),
    "keep_alive": (float, "seconds an idle keep-alive connection stays open"),
    "request_timeout": (float, "seconds a client may take to send one request (408), or to read an answer "
                        "the daemon holds for it"),
    "max_connections": (int, "open client connections at most, per listener (HTTP, gRPC); beyond it new HTTP "
                        "clients get 503 and new gRPC connections are closed (also kept below the "
                        "process's open-file limit)"),
    "max_buffered_mb": (float, "request bytes all connections may buffer at once, MiB, reserved in the memory "
                        "budget; a request that would pass it gets 503 with Retry-After"),
    "max_json_mb": (float, "largest JSON document parsed, MiB (larger: 413; send big tensors as binary data)"),
    "max_json_depth": (int, "deepest nesting of JSON arrays and objects accepted (deeper: 400)"),
    "max_pipeline": (int, "requests one connection may have waiting for answers; reading it pauses beyond"),
    "write_buffer_kb": (int, "answer bytes queued for a client that does not read, KiB, before the daemon "
                        "stops reading its further requests"),
    "max_header_kb": (int, "largest request line plus headers, KiB (larger: 431)"),
    "tick": (float, "seconds between serving-loop ticks (watchdog, telemetry, idle sweep)"),
    "log_level": (str, "debug | info | warning | error"),
    "access_log": (_bool, "log every request"),
}


def build_parser(prog: str = "cuvil-edged") -> argparse.ArgumentParser:
    """The argparse parser for :data:`OPTIONS` (every default None: resolved in :func:`load`)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="cuvil-edge on-device daemon: serves bundles over KServe v2 HTTP "
        "(tritonclient-compatible). Every option also reads CUVIL_EDGED_<NAME>.",
    )
    for name, (_conv, help_text) in OPTIONS.items():
        flag = "--" + name.replace("_", "-")
        default = getattr(Config(), name)
        env = ENV_PREFIX + name.upper()
        parser.add_argument(flag, dest=name, default=None, metavar=name.upper(),
                            help=f"{help_text} [env {env}; default {_shown(default)}]")
    return parser


def _shown(default: object) -> str:
    """A default as a user would type it: ``/var/lib/cuvil-edge``, not ``PosixPath('/var/lib/cuvil-edge')``."""
    return "unset" if default is None else str(default)


def load(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Resolve the configuration: command line first, then ``CUVIL_EDGED_*``, then defaults.

    Raises:
        DaemonError: a value does not convert or is out of range; the message names the option.
    """
    environ = os.environ if environ is None else environ
    ns = build_parser().parse_args(list(argv) if argv is not None else None)
    cfg = Config()
    for name, (conv, _help) in OPTIONS.items():
        raw = getattr(ns, name)
        source = "--" + name.replace("_", "-")
        if raw is None:
            raw = environ.get(ENV_PREFIX + name.upper())
            source = ENV_PREFIX + name.upper()
        if raw is None or raw == "":
            continue
        try:
            setattr(cfg, name, conv(raw))
        except (TypeError, ValueError) as exc:
            raise DaemonError(f"{source}={raw!r}: {exc}") from exc
    if cfg.token_file is not None and cfg.token is None:
        try:
            cfg.token = cfg.token_file.read_text().strip()
        except OSError as exc:
            raise DaemonError(f"--token-file {cfg.token_file}: cannot read it: {exc}") from exc
        if not cfg.token:
            raise DaemonError(f"--token-file {cfg.token_file} is empty; put the token in it")
    if not 0 <= cfg.port <= 65535:
        raise DaemonError(f"--port {cfg.port}: use 0..65535")
    if cfg.grpc_port is not None and not 0 <= cfg.grpc_port <= 65535:
        raise DaemonError(f"--grpc-port {cfg.grpc_port}: use 0..65535")
    if cfg.grpc_max_message_mb is not None and cfg.grpc_max_message_mb <= 0:
        raise DaemonError(f"--grpc-max-message-mb {cfg.grpc_max_message_mb}: must be positive")
    if cfg.grpc_io not in IO_MODES:
        raise DaemonError(f"--grpc-io {cfg.grpc_io!r}: use {' or '.join(IO_MODES)}")
    if cfg.grpc_max_streams < 1 or cfg.grpc_max_rpcs < 1:
        raise DaemonError("--grpc-max-streams and --grpc-max-rpcs must be at least 1")
    if cfg.max_body_mb <= 0:
        raise DaemonError(f"--max-body-mb {cfg.max_body_mb}: must be positive")
    for name in ("max_connections", "max_json_depth", "max_pipeline", "write_buffer_kb", "max_header_kb"):
        if getattr(cfg, name) < 1:
            raise DaemonError(f"--{name.replace('_', '-')} {getattr(cfg, name)}: must be at least 1")
    for name in ("max_buffered_mb", "max_json_mb", "keep_alive", "request_timeout"):
        if not getattr(cfg, name) > 0:
            raise DaemonError(f"--{name.replace('_', '-')} {getattr(cfg, name)}: must be positive")
    if cfg.device not in ("auto", "cpu", "gpu"):
        raise DaemonError(f"--device {cfg.device!r}: use auto, cpu or gpu")
    if cfg.max_batch is not None and cfg.max_batch < 1:
        raise DaemonError(f"--max-batch {cfg.max_batch}: must be at least 1")
    if cfg.max_depth < 1:
        raise DaemonError(f"--max-depth {cfg.max_depth}: must be at least 1")
    if cfg.scratch_idle_s < 0:
        raise DaemonError(f"--scratch-idle-s {cfg.scratch_idle_s}: must be >= 0")
    if cfg.max_queue_delay_us < 0:
        raise DaemonError(f"--max-queue-delay-us {cfg.max_queue_delay_us}: must be >= 0")
    if cfg.log_level.lower() not in ("debug", "info", "warning", "error"):
        raise DaemonError(f"--log-level {cfg.log_level!r}: use debug, info, warning or error")
    return cfg
