"""``cuvil-edge top`` in a real terminal (tmux) against a real daemon, and its parts."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from cuvil_edge.top import TopError, fetch_view, parse_prometheus, render

REPO = Path(__file__).resolve().parents[2]


class TestParsePrometheus:
    def test_labels_values_and_escapes(self) -> None:
        text = (
            "# HELP x y\n# TYPE x gauge\n"
            'cuvil_prefetch_info{model="m",version="1",reason="cut: queue {p95} 5 ms, \\"hot\\"\\nnext"} 1\n'
            "cuvil_memory_used_bytes 1.5e+09\n"
            'nv_inference_count{model="a,b",version="2"} 7\n'
            "garbage line without value\n"
            'broken{model="x} 3\n'
        )
        m = parse_prometheus(text)
        assert m["cuvil_prefetch_info"] == [({"model": "m", "version": "1",
                                               "reason": 'cut: queue {p95} 5 ms, "hot"\nnext'}, 1.0)]
        assert m["cuvil_memory_used_bytes"] == [({}, 1.5e9)]
        assert m["nv_inference_count"] == [({"model": "a,b", "version": "2"}, 7.0)]
        assert "broken" not in m and "garbage" not in m


class TestFetchView:
    def test_unreachable_daemon_is_one_clear_error(self) -> None:
        with pytest.raises(TopError, match=r"127\.0\.0\.1:9/metrics: daemon not reachable"):
            fetch_view("http://127.0.0.1:9", timeout=2)

    def test_help(self) -> None:
        import os

        out = subprocess.run([sys.executable, "-m", "cuvil_edge.cli", "top", "--help"], capture_output=True,
                             text=True, timeout=60, cwd=REPO, env={**os.environ, "COLUMNS": "200"})
        assert out.returncode == 0 and "--ssh" in out.stdout and "q or Ctrl-C quits" in out.stdout

    def test_cli_exits_1_with_one_line(self) -> None:
        out = subprocess.run([sys.executable, "-m", "cuvil_edge.cli", "top", "--url", "http://127.0.0.1:9", "--once"],
                             capture_output=True, text=True, timeout=60, cwd=REPO)
        assert out.returncode == 1
        assert out.stderr.strip().count("\n") == 0 and "daemon not reachable" in out.stderr
        assert "Traceback" not in out.stderr

    def test_real_daemon_rows_rates_and_reasons(self, store: Path, daemon_factory: Callable[..., object]) -> None:
        d = daemon_factory(store, "--telemetry", "sim:orin-nano-8gb", "--board", "orin-nano-8gb")
        url = f"http://{d.url}"
        first = fetch_view(url)
        _load(d, 40)
        view = fetch_view(url, first)
        deadline = time.monotonic() + 30
        client = d.client()
        while view.models[0].depth is None and time.monotonic() < deadline:  # the first serving tick
            time.sleep(0.2)
            _load(d, 5, client)
            view = fetch_view(url, view)
        (row,) = view.models
        assert (row.name, row.version) == ("digits", "1.0.0")
        assert row.requests_per_s and row.requests_per_s > 0
        assert row.p50_ms is not None and row.p99_ms is not None and row.p99_ms >= row.p50_ms
        assert row.mean_batch is not None and 1 <= row.mean_batch <= 8
        assert row.depth is not None and row.depth_reason  # why it is at that depth, even unchanged
        assert row.admission == "open"
        assert view.memory["budget"] > 0 and view.memory["level_name"] == "NORMAL"
        assert view.board["ram_total"] == 8 * 1024**3 and view.board["temps_c"]
        from rich.console import Console

        console = Console(width=160, record=True, color_system=None)
        console.print(render(view))
        text = console.export_text()
        assert "digits:1.0.0" in text and "memory budget" in text and "board GPU" in text


def _load(daemon: object, n: int, client: object = None) -> None:
    client = client or daemon.client()
    x = np.random.default_rng(0).random((2, 1, 8, 8), dtype=np.float32)
    import tritonclient.http as httpclient

    for _ in range(n):
        inp = httpclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        client.infer("digits", [inp])


class Tmux:
    """A private tmux server (its own socket) with one window running a command."""

    def __init__(self, command: list[str], width: int = 170, height: int = 40) -> None:
        self.socket = f"cuvil-top-{uuid.uuid4().hex[:8]}"
        self._tmux("new-session", "-d", "-s", "top", "-x", str(width), "-y", str(height),
                   "-e", "TERM=xterm-256color", " ".join(_quote(c) for c in command))
        # Keep the pane after the command exits, so its exit status can be read.
        self._tmux("set-option", "-t", "top", "remain-on-exit", "on")

    def _tmux(self, *args: str) -> str:
        out = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            raise AssertionError(f"tmux {' '.join(args)}: {out.stderr.strip()}")
        return out.stdout

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "top")

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "top", *keys)

    def dead(self) -> tuple[bool, int | None]:
        fields = self._tmux("list-panes", "-t", "top", "-F", "#{pane_dead} #{pane_dead_status}").split()
        return fields[0] == "1", int(fields[1]) if len(fields) > 1 and fields[1].lstrip("-").isdigit() else None

    def wait(self, predicate: Callable[[str], bool], timeout: float, what: str) -> str:
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = self.screen()
            if predicate(text):
                return text
            time.sleep(0.2)
        raise AssertionError(f"{what} not on screen after {timeout} s; screen:\n{text}")

    def wait_dead(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead, status = self.dead()
            if dead:
                if status is None:  # tmux may mark the pane dead a moment before it has the status
                    time.sleep(0.5)
                    status = self.dead()[1]
                return status
            time.sleep(0.2)
        raise AssertionError(f"top still running {timeout} s after the key; screen:\n{self.screen()}")

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)


def _quote(s: str) -> str:
    import shlex

    return shlex.quote(s)


@pytest.fixture
def tmux_top(store: Path, daemon_factory: Callable[..., object]) -> Iterator[tuple[Tmux, object]]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (apt-get install tmux; scripts/bootstrap.sh test)")
    d = daemon_factory(store, "--telemetry", "sim:orin-nano-8gb", "--board", "orin-nano-8gb")
    term = Tmux([sys.executable, "-m", "cuvil_edge.cli", "top", "--url", f"http://{d.url}", "--interval", "0.5"])
    try:
        yield term, d
    finally:
        term.close()


class TestTopInTmux:
    def test_shows_model_row_and_memory_line_and_quits_on_q(self, tmux_top: tuple[Tmux, object]) -> None:
        term, d = tmux_top
        stop = threading.Event()

        def load() -> None:  # requests while the view runs, so the rates and percentiles move
            client = d.client()  # one connection: a client per round would reach --max-connections
            while not stop.is_set():
                _load(d, 5, client)

        worker = threading.Thread(target=load)
        worker.start()
        try:
            screen = term.wait(lambda s: "digits:1.0.0" in s and "memory budget" in s, 60, "model row and memory line")
            assert "cuvil-edge top" in screen and "pressure NORMAL" in screen
            row = next(line for line in screen.splitlines() if "digits:1.0.0" in line)
            assert "open" in row
            # The view takes the pane's width (170), not an inherited COLUMNS: no column is cut.
            header = next(line for line in screen.splitlines() if "queue" in line and "admission" in line)
            assert "…" not in header, screen
            # A refresh later the row shows a request rate and latency percentiles from the load.
            term.wait(lambda s: any("digits:1.0.0" in ln and "open" in ln and " - " not in ln.split("open")[0]
                                    for ln in s.splitlines()), 30, "rates and percentiles in the model row")
            assert "board GPU" in term.screen() and "temperatures" in term.screen()
        finally:
            stop.set()
            worker.join(30)
        term.keys("q")
        # A refresh may be mid-fetch when q arrives (one-second cycle, slower on a loaded CI machine).
        # Exited by itself: status 0 (tmux sometimes reports no status for a pane that has ended;
        # then no traceback on the screen tells a clean exit).
        assert term.wait_dead(60) in (0, None)
        after = term.screen()
        assert "Traceback" not in after

    def test_ctrl_c_exits_cleanly(self, tmux_top: tuple[Tmux, object]) -> None:
        term, _ = tmux_top
        term.wait(lambda s: "memory budget" in s, 60, "memory line")
        term.keys("C-c")
        assert term.wait_dead(60) in (0, None)
        assert "Traceback" not in term.screen()
