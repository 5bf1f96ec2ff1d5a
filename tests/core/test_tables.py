"""Tables print whole ids in a pipe and in a narrow terminal, so ids can be read and grepped."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import subprocess
import sys

import pytest
from rich.console import Console
from rich.table import Table

from cuvil_edge._console import id_column, print_table
from cuvil_edge.targets import all_targets

BOARD_IDS = sorted(all_targets())


def _run_targets(env: dict[str, str], tty: bool) -> str:
    """``cuvil-edge targets`` in a fresh interpreter, stdout a pipe or a pseudo-terminal."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")} | env
    if not tty:
        proc = subprocess.run([sys.executable, "-m", "cuvil_edge.cli", "targets"], env=full_env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "cuvil_edge.cli", "targets"], env=full_env,
                                stdout=slave, stderr=subprocess.PIPE)
        os.close(slave)
        chunks = []
        while True:
            ready, _, _ = select.select([master], [], [], 300)
            if not ready:
                proc.kill()
                raise AssertionError("no output from the CLI within 300 s")
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        _, err = proc.communicate(timeout=300)
        proc.stderr.close()
        assert proc.returncode == 0, err
    finally:
        os.close(master)
    # Colours are on in a terminal; drop their escape codes to measure the visible lines.
    text = b"".join(chunks).decode("utf-8", "replace").replace("\r", "")
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


def _lines_with(text: str, board: str) -> int:
    return sum(1 for line in text.splitlines() if board in line)


@pytest.mark.parametrize("columns", [None, "80", "40"])
def test_targets_piped_prints_every_id_whole(columns):
    out = _run_targets({"COLUMNS": columns} if columns else {}, tty=False)
    for board in BOARD_IDS:
        assert _lines_with(out, board) == 1, f"{board} not whole on one line:\n{out}"
    assert "…" not in out


def test_targets_in_an_80_column_terminal_keeps_ids_whole():
    out = _run_targets({"COLUMNS": "80", "TERM": "xterm"}, tty=True)
    for board in BOARD_IDS:
        assert _lines_with(out, board) == 1, f"{board} cut in an 80-column terminal:\n{out}"
    assert max(len(line) for line in out.splitlines()) <= 80


def test_targets_json_stays():
    proc = subprocess.run([sys.executable, "-m", "cuvil_edge.cli", "targets", "--json"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "40"})
    assert proc.returncode == 0, proc.stderr
    assert "orin-nano-8gb" in proc.stdout and proc.stdout.lstrip().startswith("[")


class TestPrintTable:
    def _table(self) -> Table:
        table = Table(title="devices")
        id_column(table, "device")
        for col in ("status", "reason"):
            table.add_column(col, overflow="fold")
        table.add_row("root@orin-nano-8gb-lab-rack-07.example:2222", "deployed", "x" * 90)
        return table

    def test_a_pipe_gets_the_natural_width(self):
        buf = io.StringIO()
        print_table(self._table(), Console(file=buf, width=80))
        lines = buf.getvalue().splitlines()
        assert _lines_with(buf.getvalue(), "root@orin-nano-8gb-lab-rack-07.example:2222") == 1
        assert _lines_with(buf.getvalue(), "x" * 90) == 1
        assert max(len(line) for line in lines) > 80

    def test_plain_console_print_would_cut_it(self):
        """The failure print_table exists for: without it the reason column folds at 80 columns."""
        buf = io.StringIO()
        Console(file=buf, width=80).print(self._table())
        assert _lines_with(buf.getvalue(), "x" * 90) == 0

    def test_a_terminal_keeps_its_width_and_the_id_column(self):
        buf = io.StringIO()
        print_table(self._table(), Console(file=buf, width=80, force_terminal=True, color_system=None))
        text = buf.getvalue()
        assert max(len(line) for line in text.splitlines()) <= 80
        assert _lines_with(text, "root@orin-nano-8gb-lab-rack-07.example:2222") == 1


def test_other_tables_print_whole_ids_in_a_pipe(digits_model, tmp_path):
    """The engine plan table's file names and inspect's node names survive an 80-column pipe too."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")} | {"COLUMNS": "80"}
    plan = subprocess.run([sys.executable, "-m", "cuvil_edge.cli", "engine", "plan", str(digits_model),
                           "--target", "agx-orin-64gb", "--dla-core", "0", "--precision", "fp16", "--out-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert plan.returncode == 0, plan.stderr
    names = [json.loads(p.read_text())["engine_file"] for p in sorted(tmp_path.rglob("plan-trt*.json"))]
    assert len(names) == 3 and all(n.startswith("agx-orin-16sm-64gb_l4t-") for n in names)
    for name in names:
        assert _lines_with(plan.stdout, name) == 1, plan.stdout
    inspect = subprocess.run([sys.executable, "-m", "cuvil_edge.cli", "inspect", str(digits_model),
                              "--target", "agx-orin-64gb"], capture_output=True, text=True, timeout=300, env=env)
    assert inspect.returncode in (0, 1), inspect.stderr
    assert "…" not in inspect.stdout
