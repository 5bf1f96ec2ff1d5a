"""The daemon's process: listen, load models, tick, handle signals, drain and exit.

As uvicorn's ``server.py``: :class:`Server` owns the event loop work, :class:`ServerState` the
counters every connection shares. Lifespan is a small state machine::

    starting -> (bind, load + warm models) -> ready  --SIGTERM--> draining -> stopped
                                               ^  |
                                               +--+ SIGHUP: rescan the store, load/swap/unload

``READY=1`` goes to systemd only once every model loaded and warmed; the tick loop (every
``--tick`` seconds) sweeps idle connections, feeds telemetry to the memory co-scheduler and the
prefetch controller, applies their decisions, and sends ``WATCHDOG=1`` only while the serving
loop makes progress (no batch stuck longer than the watchdog allows). At start and every second
of ticks it reverts a deploy switch left pending past its confirm deadline
(``cuvil_edge/bundle/activation.py``) and reloads the store, so a crashed deploy step, a lost
link or a reboot never leaves an unconfirmed version serving. SIGTERM stops accepting,
lets in-flight requests finish (up to ``--drain-timeout``), closes connections, frees backends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import stat
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cuvil_edge._test_hooks import FAULT_HOOKS_ENV, fault_hooks_enabled, stall_forever
from cuvil_edge.bundle.activation import can_write_state, expired_pending, revert_expired
from cuvil_edge.daemon.accept import Acceptor, connection_cap, listen_tcp, listen_unix
from cuvil_edge.daemon.config import Config
from cuvil_edge.daemon.footprint import freeze_heap, page_out_libraries, trim_heap
from cuvil_edge.daemon.gpu_metrics import GpuMetrics, power_limit_w
from cuvil_edge.daemon.http import HttpProtocol
from cuvil_edge.daemon.infer import MemoryRefused
from cuvil_edge.daemon.kserve import App
from cuvil_edge.daemon.metrics import render_prometheus
from cuvil_edge.daemon.models import ModelInstance, ModelRegistry
from cuvil_edge.daemon.resources import Resources
from cuvil_edge.daemon.shm import SharedMemoryRegistry
from cuvil_edge.daemon.state import ServerState
from cuvil_edge.daemon.store import BundleStore
from cuvil_edge.errors import CuvilEdgeError, DaemonError
from cuvil_edge.runtime import BackendOptions

if TYPE_CHECKING:
    from cuvil_edge.daemon.grpc_server import GrpcFrontend

__all__ = ["STARTUP_FAILURE", "Server", "ServerState"]

log = logging.getLogger("cuvil_edge.daemon")
access = logging.getLogger("cuvil_edge.daemon.access").info  # --access-log

STARTUP_FAILURE = 3  # exit code, as uvicorn's
REVERT_CHECK_S = 1.0  # how often the tick looks for deploy switches past their confirm deadline


class Server:
    """Runs the daemon for a :class:`Config`.

    Args:
        config (Config): the settings.
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self.state = ServerState(config.limits(), config.token, config.access_log)
        self.store = BundleStore(config.store)
        self.resources = Resources(config)
        self.registry: ModelRegistry | None = None
        self.app: App | None = None
        self.shm = SharedMemoryRegistry(max_input_bytes=config.max_body_bytes) if config.shared_memory else None
        self.grpc: GrpcFrontend | None = None  # when gRPC is on
        self.gpu_metrics: GpuMetrics | None = None  # Triton's nv_gpu_* series, with telemetry
        self._servers: list[Acceptor] = []
        self._stop: asyncio.Event | None = None  # created on the loop
        self._tasks: set[asyncio.Task[Any]] = set()
        self.bound: list[str] = []
        self.started_at = time.time()
        self._revert_warned = False

    # ------------------------------------------------------------------ entry point

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT; return the exit code (0, or 3 on a startup failure)."""
        try:
            return asyncio.run(self.serve())
        except KeyboardInterrupt:
            return 0

    async def serve(self) -> int:
        """The lifespan state machine (see the module docstring)."""
        loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            await self.startup(loop)
        except (CuvilEdgeError, OSError) as exc:
            log.error("startup failed: %s", exc)
            self.resources.notify(f"STATUS=startup failed: {exc}")
            await self._close_listeners()
            if self.registry is not None:
                await self.registry.close_all()
            self.resources.close()
            return STARTUP_FAILURE
        for sig, handler in ((signal.SIGTERM, self._on_term), (signal.SIGINT, self._on_term),
                             (signal.SIGHUP, self._on_hup)):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, handler)
        if fault_hooks_enabled():  # test-only (_test_hooks.py): the HIL rig's watchdog test
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signal.SIGUSR2, self._fault_stall)
                log.warning("debug fault hooks on (%s=1): SIGUSR2 stalls the event loop", FAULT_HOOKS_ENV)
        tick = asyncio.ensure_future(self._supervised(self._tick_loop, "tick"))
        await self._stop.wait()
        await self.shutdown()
        tick.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await tick
        return 0

    # ------------------------------------------------------------------ startup

    async def startup(self, loop: asyncio.AbstractEventLoop) -> None:
        """Check the store, bind, start telemetry, load and warm the models, then report ready."""
        cfg = self.config
        self.store.check()
        self.resources.start()
        self._start_gpu_metrics()
        opts = BackendOptions(device=cfg.device, intra_op_threads=cfg.intra_op_threads,
                              max_batch=cfg.max_batch, extra={"spin": cfg.spin})
        self.registry = ModelRegistry(self.store, opts, cfg, admit=self.resources.admit,
                                      release=self.resources.release, measured=self.resources.measured,
                                      pool=self.resources.pool)
        self.resources.bind(self.registry)
        self._reserve_request_buffers()
        self.app = App(self.registry, self.state, cfg.token, self.render_metrics,
                       self.resources.pressure if self.resources.has_scheduler else None,
                       max_body=cfg.max_body_bytes, shm=self.shm, limits=self.state.limits)
        await self._listen(loop)
        await self._listen_grpc()
        self._cap_connections()  # with both front ends' descriptors open
        self.revert_expired_switches()  # before loading: a reboot mid-deploy ends on the gated version
        self.resources.notify("STATUS=loading models")
        names = cfg.models or self.store.names()
        failed: dict[str, str] = {}
        for name in names:
            try:
                await self.registry.load(name)
            except CuvilEdgeError as exc:
                if cfg.strict:
                    raise DaemonError(f"model {name!r} failed to load: {exc}") from exc
                if not isinstance(exc, MemoryRefused):  # it may fit later: not a model that cannot serve
                    failed[name] = str(exc)
                log.error("model %s not served: %s", name, exc)
        if failed and len(failed) == len(names):
            # Serving nothing at all is a failed start (exit 3), not a daemon that reports ready.
            raise DaemonError(f"no model can serve: {len(failed)} failed to load "
                              f"({', '.join(sorted(failed))}); see the errors above")
        self._settle_memory()
        self.state.ready = True
        self.state.phase = "ready"
        loaded = [f"{i.name}:{i.version}" for i in self.registry.instances()]
        log.info("cuvil-edged ready on %s serving %s", ", ".join(self.bound), ", ".join(loaded) or "no models")
        self.resources.notify("READY=1", f"MAINPID={os.getpid()}",
                              f"STATUS=serving {len(loaded)} model(s) on {', '.join(self.bound)}")

    def _settle_memory(self) -> None:
        """After models load (start-up, a reload): hand back what loading left resident and
        serving does not use (see :mod:`cuvil_edge.daemon.footprint`)."""
        freeze_heap()
        trim_heap()
        if self.config.page_out:
            page_out_libraries()

    def _reserve_request_buffers(self) -> None:
        """Reserve the bytes connections may buffer in the memory budget, so models fit beside them.

        When the budget cannot spare ``--max-buffered-mb``, the cap shrinks to an eighth of the
        budget (never below one request of ``--max-body-mb``) rather than failing the start.
        """
        sched = self.resources.scheduler
        limits = self.state.limits
        if sched is None:
            return
        from dataclasses import replace

        from cuvil_edge.daemon.scheduler import MemoryBudgetError

        want = limits.max_buffered
        headroom = sched.headroom_bytes
        if want > headroom // 2:
            want = max(limits.max_body, headroom // 8)
            log.warning("the memory budget cannot spare --max-buffered-mb %.0f; request buffers capped at "
                        "%.0f MiB", limits.max_buffered / 1048576, want / 1048576)
        if want > headroom:
            log.warning("request buffers (%.0f MiB) not reserved in the memory budget: %.0f MiB free",
                        want / 1048576, max(0, headroom) / 1048576)
            self.state.limits = replace(limits, max_buffered=want)
            return
        try:
            sched.admit("http:request-buffers", want, loading=False)
        except MemoryBudgetError as exc:
            log.warning("request buffers not reserved in the memory budget: %s", exc)
        # Busy for good: the pressure ladder never picks this reservation as an idle model to unload.
        sched.begin_use("http:request-buffers")
        self.state.limits = replace(limits, max_buffered=want)

    def _cap_connections(self) -> None:
        cap = connection_cap(self.state.limits.max_connections)
        if cap < self.state.limits.max_connections:
            log.warning("--max-connections %d lowered to %d to stay below the open-file limit (LimitNOFILE)",
                        self.state.limits.max_connections, cap)
        self.state.max_connections = cap

    async def _listen(self, loop: asyncio.AbstractEventLoop) -> None:
        cfg = self.config
        app, state = self.app, self.state
        assert app is not None

        def factory() -> HttpProtocol:
            return HttpProtocol(app.handle, state)

        socks = []
        if cfg.uds is not None:
            path = Path(cfg.uds)
            if path.exists() or path.is_symlink():
                if not stat.S_ISSOCK(path.lstat().st_mode):
                    raise DaemonError(f"--uds {path}: exists and is not a socket; remove it or pick another path")
                path.unlink()
            socks.append(listen_unix(str(path)))
            os.chmod(path, 0o660)
            self.bound.append(f"unix:{path}")
        else:
            try:
                socks = listen_tcp(cfg.host, cfg.port)
            except OSError as exc:
                raise DaemonError(f"cannot listen on {cfg.host}:{cfg.port}: {exc.strerror or exc}") from exc
            for sock in socks:
                host, port = sock.getsockname()[:2]
                self.bound.append(f"http://{host}:{port}")
        def admit(pending: int) -> bool:
            if len(state.connections) + pending < state.max_connections:
                return True
            state.on_refused("connections")
            return False

        for sock in socks:
            acceptor = Acceptor(loop, sock, factory, admit=admit)
            acceptor.start()
            self._servers.append(acceptor)

    def _start_gpu_metrics(self) -> None:
        """Feed every telemetry sample to Triton's GPU metrics (energy integrates all of them)."""
        monitor = self.resources.monitor
        if monitor is None:
            return
        self.gpu_metrics = GpuMetrics(self.config.board, power_limit_w(self.resources.target))
        if monitor.latest is not None:
            self.gpu_metrics.update(monitor.latest)
        monitor.subscribe(self.gpu_metrics.update)

    async def _listen_grpc(self) -> None:
        """Start the gRPC front end (same app, models and limits) unless it is turned off."""
        from cuvil_edge.daemon.grpc_cq import choose_io

        if self.config.grpc:
            choose_io(self.config.grpc_io)  # before grpc is first imported; it logs why when it cannot
        from cuvil_edge.daemon.grpc_server import grpc_address

        if grpc_address(self.config) is None:
            return
        try:
            from cuvil_edge.daemon.grpc_server import GrpcFrontend
        except ImportError as exc:
            raise DaemonError(f"gRPC needs the grpcio package ({exc}); install it or run with --grpc 0") from exc
        assert self.app is not None  # startup made it before listening
        self.grpc = GrpcFrontend(self.app, self.config, self.shm)
        self.bound.append(await self.grpc.start())

    # ------------------------------------------------------------------ signals

    def _on_term(self) -> None:
        if self._stop is not None and not self._stop.is_set():
            log.info("SIGTERM: draining in-flight requests")
            self._stop.set()

    def _fault_stall(self) -> None:
        """Debug fault hook: block the event loop (no tick, no ``WATCHDOG=1``: systemd must restart us)."""
        stall_forever(log)

    def _on_hup(self) -> None:
        log.info("SIGHUP: reloading the bundle store")
        task = asyncio.ensure_future(self.reload())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def reload(self) -> dict[str, str]:
        """Rescan the store: load new models, swap changed ``current`` versions, unload removed ones.

        Returns:
            dict[str, str]: model name -> what happened (``loaded``, ``swapped``, ``unloaded``,
            ``unchanged``, or ``failed: ...``).
        """
        assert self.registry is not None
        self.resources.notify("RELOADING=1",
                              f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}",
                              "STATUS=reloading the bundle store")
        done: dict[str, str] = {}
        wanted = set(self.config.models or self.store.names())
        for name in sorted(wanted):
            try:
                current = self.store.current(name)
            except OSError as exc:
                done[name] = f"failed: {exc}"
                continue
            entry = self.registry.entries.get(name)
            inst = entry.instance if entry else None
            if inst is not None and inst.version == current and inst.bundle_dir.resolve() == \
                    (self.store.bundles / name / (current or "")).resolve() and \
                    not await asyncio.to_thread(self.registry.engine_changed, inst):
                done[name] = "unchanged"
                continue
            try:
                await self.registry.load(name)
                done[name] = "swapped" if inst is not None else "loaded"
            except CuvilEdgeError as exc:
                done[name] = f"failed: {exc}"
        for name, entry in list(self.registry.entries.items()):
            if name not in wanted and entry.instance is not None:
                await self.registry.unload(name)
                done[name] = "unloaded"
        log.info("store reload: %s", ", ".join(f"{k} {v}" for k, v in done.items()) or "nothing to do")
        if any(v in ("loaded", "swapped", "unloaded") for v in done.values()):
            self._settle_memory()
        self.resources.notify("READY=1", f"STATUS=reloaded: {len(self.registry.instances())} model(s) serving")
        return done

    # ------------------------------------------------------------------ tick

    async def _supervised(self, loop_fn: Callable[[], Awaitable[None]], name: str) -> None:
        """Run ``loop_fn`` for good: when it raises, log it and start it again a second later."""
        while True:
            try:
                await loop_fn()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s loop failed; restarting it", name)
                await asyncio.sleep(1.0)

    async def _tick_loop(self) -> None:
        """The tick, supervised: an exception in one round is logged and the loop goes on, so the
        watchdog pings never stop because of something read from disk (issue 26, finding 7)."""
        cfg = self.config
        next_check = time.monotonic() + REVERT_CHECK_S
        while True:
            await asyncio.sleep(cfg.tick)
            try:
                self.tick()
            except Exception:
                log.exception("tick failed")
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + REVERT_CHECK_S
                # Off the event loop: it reads state files (bounded in size, but a disk can be slow).
                if await asyncio.to_thread(self.revert_expired_switches):
                    # As SIGHUP does, in its own task: the tick keeps feeding the watchdog meanwhile.
                    task = asyncio.ensure_future(self.reload())
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)

    def revert_expired_switches(self) -> bool:
        """Revert deploy switches left pending past their confirm deadline (``bundle/activation.py``);
        True when something was reverted (the caller reloads the store).

        Where this process may not write the store's deploy state (a stock install: the unit's
        dynamic user, the store's deploy files root's), root reverts instead (the unit's
        ``ExecStartPre=+`` and the deploy step's revert timer, which reloads the daemon); the
        daemon only notes once that a switch is due. Never raises: a bad state file is
        ignored and logged once by the state reader.
        """
        store = self.config.store
        try:
            if not can_write_state(store):
                due = expired_pending(store)
                if due and not self._revert_warned:
                    log.info("unconfirmed deploy switch past its deadline (%s); root's revert timer reverts it "
                             "(this daemon may not write %s)", ", ".join(f"{n}: {r}" for n, r in due), store)
                    self._revert_warned = True
                return False
            done = revert_expired(store)
        except Exception as exc:  # noqa: BLE001 - nothing read from disk may stop the daemon
            if not self._revert_warned:
                log.warning("cannot revert pending deploy switches in %s: %s: %s", store, type(exc).__name__, exc)
                self._revert_warned = True
            return False
        for r in done:
            log.warning("reverted unconfirmed switch of %s to %s: %s", r.name, r.version, r.reason)
        return bool(done)

    def tick(self) -> None:
        """One serving-loop tick: idle sweep, telemetry and scheduler, watchdog."""
        now = time.monotonic()
        if self.state.trim_wanted:
            # Answers of a few MiB live in the C heap's arenas, not in their own mappings: freed,
            # they stay in the process until the heap is trimmed. Trimmed a tick after the drop
            # was asked for: a connection the sweep below aborts frees its answer only when the
            # loop runs its connection_lost, after this tick (trimmed at once, that answer stayed).
            self.state.trim_wanted = False
            trim_heap()
        for conn in list(self.state.connections):
            conn.sweep(now)
        instances = self.registry.instances() if self.registry else []
        self.resources.tick(instances)
        self._release_idle_scratch(instances, now)
        oldest_s = 0.0
        for inst in instances:
            b = inst.batcher
            if b is not None:
                oldest = b.oldest_running()
                if oldest is not None:
                    oldest_s = max(oldest_s, now - oldest)
        # This tick ran, so the loop makes progress; a batch stuck too long withholds the ping.
        self.resources.watchdog_tick(oldest_s)

    def _release_idle_scratch(self, instances: list[ModelInstance], now: float) -> None:
        """Models idle after a burst of batches give their runtime scratch back, on a worker
        thread (a batch-1 run each); a burst is claimed here, so it is handed back once."""
        for inst in instances:
            rows = inst.claim_idle_scratch(now)
            if rows:
                asyncio.get_running_loop().run_in_executor(None, inst.release_idle_scratch, rows)

    # ------------------------------------------------------------------ shutdown

    async def _close_listeners(self) -> None:
        for srv in self._servers:
            srv.close()
        self._servers.clear()
        if self.grpc is not None:
            await self.grpc.stop(0)
        if self.config.uds is not None:
            with contextlib.suppress(OSError):
                Path(self.config.uds).unlink()

    async def shutdown(self) -> None:
        """Stop accepting, drain in-flight requests, close connections, free the models."""
        self.state.phase = "draining"
        self.state.shutting_down = True
        self.resources.notify("STOPPING=1", "STATUS=draining")
        for srv in self._servers:
            srv.close()
        # gRPC refuses new calls now and lets those in progress finish within the drain timeout.
        grpc_stopped = asyncio.ensure_future(self.grpc.stop(self.config.drain_timeout)) if self.grpc else None
        deadline = time.monotonic() + self.config.drain_timeout
        while time.monotonic() < deadline:
            for conn in list(self.state.connections):
                conn.shutdown()
            busy = self.state.inflight > 0 or any(not c.idle for c in self.state.connections)
            if not busy:
                break
            await asyncio.sleep(0.02)
        else:
            log.warning("drain timeout: %d request(s) still in flight", self.state.inflight)
        for conn in list(self.state.connections):
            if conn.transport is not None:
                conn.transport.close()
        if grpc_stopped is not None:
            await grpc_stopped
        await self._close_listeners()
        if self.registry is not None:
            await self.registry.close_all()
        if self.shm is not None:
            self.shm.close()
        self.resources.close()
        self.state.stopped = True
        self.state.phase = "stopped"
        log.info("cuvil-edged stopped after %d request(s)", self.state.total_requests)

    # ------------------------------------------------------------------ metrics

    def render_metrics(self) -> bytes:
        """``/metrics`` body."""
        instances = self.registry.instances() if self.registry else []
        gauges = self.resources.gauges(instances)
        if self.gpu_metrics is not None:
            gauges.update(self.gpu_metrics.gauges())
        s = self.state
        gauges["cuvil_server_inflight_requests"] = ("Requests being served now", [({}, s.inflight)])
        gauges["cuvil_server_connections"] = ("Open client connections", [({}, len(s.connections))])
        gauges["cuvil_model_queue_size"] = (
            "Requests waiting for a batch",
            [({"model": i.name, "version": i.version}, i.batcher.queued if i.batcher else 0) for i in instances])
        gauges["cuvil_model_batch_cap"] = (
            "Current dynamic batch cap (pressure ladder)",
            [({"model": i.name, "version": i.version}, i.batcher.cap if i.batcher else 0) for i in instances])
        gauges["cuvil_model_memory_bytes"] = (
            "Measured memory footprint of the model",
            [({"model": i.name, "version": i.version}, i.footprint_bytes) for i in instances])
        counters: dict[str, tuple[str, list[tuple[dict[str, str], float]]]] = {
            "cuvil_http_requests_total": ("HTTP requests answered", [({}, s.total_requests)]),
            "cuvil_http_protocol_errors_total": ("Malformed or oversized HTTP requests", [({}, s.protocol_errors)]),
            "cuvil_http_client_gone_total": ("Requests whose client disconnected first", [({}, s.client_gone)]),
            "cuvil_http_decoded_off_loop_total": ("Inference bodies decoded on a worker thread (compressed, "
                                                  "or a JSON part over 256 KiB)", [({}, s.decoded_off_loop)]),
            "cuvil_http_rejected_total": ("Inference requests refused with 503 under memory pressure",
                                          [({}, s.rejected)]),
            "cuvil_http_unknown_model_total": ("Inference requests for a model not served",
                                               [({}, s.failed_unknown)]),
            "cuvil_http_refused_total": ("Clients refused before their request was read: connection cap, "
                                         "bearer token, buffered-bytes cap",
                                         [({"reason": k}, v) for k, v in sorted(s.refused.items())]),
            "cuvil_http_fd_exhausted_total": ("Times accept() found no free file descriptor",
                                              [({}, sum(a.exhausted_total for a in self._servers))]),
        }
        gauges["cuvil_http_buffered_bytes"] = ("Request bytes buffered by all connections now",
                                               [({}, s.buffered)])
        counters.update(self.resources.counters())
        if self.grpc is not None:
            counters.update(self.grpc.counters())
        if self.gpu_metrics is not None:
            counters.update(self.gpu_metrics.counters())
        return render_prometheus((i.stats for i in instances), gauges, counters)
