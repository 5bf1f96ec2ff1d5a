"""The gRPC transport (grpc core's completion queue, driven from the event loop): what is its own."""

from __future__ import annotations

import os
import threading
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from cuvil_edge.daemon import grpc_cq
from cuvil_edge.errors import DaemonError


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rpartition(" ")[2])
    raise AssertionError(f"{name} missing")


def test_concurrent_calls_batch_together(daemon, digits_data):
    """Calls whose messages arrive in one burst run as one batch (each used to run alone: mean
    batch 1.0 at 8 clients), and every answer is its own request's."""
    x = np.ascontiguousarray(digits_data[:8], np.float32)
    errors: list[str] = []
    go = threading.Barrier(8)

    def client(i: int) -> None:
        c = daemon.grpc_client()
        inp = grpcclient.InferInput("input", [1, 1, 8, 8], "FP32")
        inp.set_data_from_numpy(x[i:i + 1])
        mine = c.infer("digits", [inp]).as_numpy("logits")
        go.wait()
        for _ in range(150):
            got = c.infer("digits", [inp]).as_numpy("logits")
            if not np.array_equal(got, mine):
                errors.append(f"client {i}: another request's answer")
                return

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    text = daemon.metrics()
    labels = '{model="digits",version="1.0.0"}'
    requests = _metric(text, f"nv_inference_count{labels}")
    batches = _metric(text, f"nv_inference_exec_count{labels}")
    assert requests >= 8 * 151
    assert batches < 0.9 * requests, f"{requests:.0f} requests ran in {batches:.0f} batches"


def test_a_grpcio_without_the_core_parts_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(grpc_cq, "_core", lambda: types.SimpleNamespace(Server=object))
    with pytest.raises(DaemonError, match=r"grpcio .* lacks CompletionQueue.*--grpc 0"):
        grpc_cq.check_core()


def test_a_call_is_read_before_the_loop_sees_it_only_when_authorized_and_under_the_gate():
    """The poller thread arms a call's first receive (its message then comes in the same burst as
    the call) only for an inference or unary method, with the bearer token, under --grpc-max-rpcs:
    an unauthenticated or over-limit call's message stays unread, as before."""
    import asyncio

    from cuvil_edge.daemon.grpc_calls import CallPolicy, Method

    class Frontend:
        state = types.SimpleNamespace()
        registry = None

        def authorized(self, metadata):
            return ("authorization", "Bearer t") in metadata

    def call(method: bytes, metadata=()):
        return grpc_cq.ServerCall(None, method, tuple(metadata), None)

    async def main() -> None:
        infer = Method("ModelInfer", "infer", bytes)
        methods = {b"/m/Infer": infer, b"/m/Stream": Method("ModelStreamInfer", "stream", bytes),
                   b"/m/Live": Method("ServerLive", "open", bytes)}
        policy = CallPolicy(Frontend(), methods, max_rpcs=2)
        token = [("authorization", "Bearer t")]
        assert not policy.admit(call(b"/m/Infer"))  # no token
        assert not policy.admit(call(b"/m/Nope", token))  # unknown method
        assert not policy.admit(call(b"/m/Stream", token)) and not policy.admit(call(b"/m/Live", token))
        assert policy.gate.active == 0
        assert policy.admit(call(b"/m/Infer", token)) and policy.admit(call(b"/m/Infer", token))
        assert not policy.admit(call(b"/m/Infer", token))  # the gate is full: left to the loop to refuse
        assert policy.gate.active == 2 and policy.gate.refused == 0
        policy.gate.leave()
        assert policy.admit(call(b"/m/Infer", token))

    asyncio.run(main())


def test_an_admitted_call_reaches_the_loop_once_with_its_message_read():
    """What ``admit`` lets in reaches ``on_call`` with its message already in (one loop wake-up
    per request); any other call comes unread, as before."""
    import asyncio

    import grpc

    seen = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        ok = grpc_cq._core().StatusCode.ok

        def on_call(call):
            seen.append((call.method, call.admitted, call.message_waiting))
            call.finish(ok, message=b"ok")

        server = grpc_cq.CompletionQueueServer(loop, (), on_call, admit=lambda c: c.method == b"/t/Early")
        port = server.bind("127.0.0.1:0")
        server.start()

        def client() -> list[bytes]:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                return [ch.unary_unary(m)(b"x", timeout=5) for m in ("/t/Early", "/t/Late")]

        try:
            assert await loop.run_in_executor(None, client) == [b"ok", b"ok"]
        finally:
            await server.stop(1)

    asyncio.run(main())
    assert seen == [(b"/t/Early", True, True), (b"/t/Late", False, False)]


def _thread_ticks(pid: int) -> dict[str, int]:
    """CPU clock ticks so far of a process's threads, by thread name."""
    out: dict[str, int] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        out[name] = out.get(name, 0) + int(fields[11]) + int(fields[12])
    return out


def _event_engine_share(d: Any, x: np.ndarray, calls: int) -> tuple[int, int]:
    """(ticks of grpc core's EventEngine threads, ticks of all threads) over ``calls`` infers."""
    c = d.grpc_client()
    inp = grpcclient.InferInput("input", [1, 1, 8, 8], "FP32")
    inp.set_data_from_numpy(x)
    for _ in range(50):
        c.infer("digits", [inp])
    before = _thread_ticks(d.proc.pid)
    for _ in range(calls):
        c.infer("digits", [inp])
    after = _thread_ticks(d.proc.pid)
    spent = {k: v - before.get(k, 0) for k, v in after.items()}
    return sum(v for k, v in spent.items() if k.startswith("event_engine")), sum(spent.values())


def test_grpc_io_poller_does_the_socket_work_on_the_transports_own_thread(store, daemon_factory, digits_data):
    """``--grpc-io poller`` (the default) takes grpc core's reads off its EventEngine threads: each
    call then wakes two threads fewer. ``engine`` leaves them there (grpc core's default); the
    option must be applied before grpc is imported, or it silently does nothing."""
    x = np.ascontiguousarray(digits_data[:1], np.float32)
    engine_ticks, engine_all = _event_engine_share(daemon_factory(store, "--grpc-io", "engine"), x, 2000)
    poller_ticks, poller_all = _event_engine_share(daemon_factory(store), x, 2000)
    assert engine_ticks >= 5, f"grpc core's EventEngine threads did {engine_ticks} of {engine_all} ticks' work"
    assert poller_ticks / poller_all < 0.4 * engine_ticks / engine_all, (
        f"EventEngine threads: {poller_ticks}/{poller_all} ticks with --grpc-io poller, "
        f"{engine_ticks}/{engine_all} with engine")


def test_choose_io_turns_the_engines_io_off_and_keeps_what_the_user_set(monkeypatch):
    env: dict[str, str] = {}
    grpc_cq.choose_io("poller", env)
    assert env["GRPC_EXPERIMENTS"] == ("-event_engine_listener,-event_engine_client,"
                                       "-event_engine_for_all_other_endpoints")
    env = {"GRPC_EXPERIMENTS": "tcp_rcv_lowat"}
    grpc_cq.choose_io("poller", env)
    assert env["GRPC_EXPERIMENTS"].startswith("tcp_rcv_lowat,-event_engine_listener,")
    env = {"GRPC_EXPERIMENTS": "event_engine_listener"}  # the user's own choice about these
    grpc_cq.choose_io("poller", env)
    assert env["GRPC_EXPERIMENTS"] == "event_engine_listener"
    env = {}
    assert grpc_cq.choose_io("engine", env) and env == {}
    monkeypatch.setattr(grpc_cq, "_grpcio_release", lambda: (1, 99))  # names not checked there
    env = {}
    assert not grpc_cq.choose_io("poller", env) and env == {}
