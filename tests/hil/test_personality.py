"""The L4T 36 personality's host-side parts: stand-in nodes, TensorRT's apt packages, tegrastats."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hil.personality import GPU_NODES, PERSONALITIES, board_figures, kernel_args, nodes_script, tensorrt_debs

HERE = Path(__file__).resolve().parents[2]


def test_every_node_cuda_opens_is_planted_on_its_own_device():
    from cuvil_edge.runtime.cuda_standin import L4T36_CUDA_NODES

    assert [n[0] for n in GPU_NODES] == list(L4T36_CUDA_NODES)
    assert len({n[1] for n in GPU_NODES}) == len(GPU_NODES)  # the device cgroup tells them apart
    assert dict((n[0], n[2]) for n in GPU_NODES)["/dev/dri/renderD128"] == "root:render"
    script = nodes_script()
    for node, source, owner, mode in GPU_NODES:
        assert f"mknod -m {mode} {node} c" in script and f"chown {owner} {node}" in script and source in script
    assert "chown root:jtop /run/jtop.sock" in script and "chmod 0660 /run/jtop.sock" in script


def test_l4t36_boots_without_psi():
    assert kernel_args("orin-nano-8gb") == ("psi=0",) and kernel_args(None) == ()


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb not installed")
def test_tensorrt_debs_are_jetpacks_layout(tmp_path):
    from cuvil_edge.bundle.device_facts import parse_dpkg_status

    debs = tensorrt_debs(tmp_path, "10.3.0")
    names = {d.name.split("_")[0]: d for d in debs}
    files = subprocess.run(["dpkg-deb", "-c", str(names["python3-libnvinfer"])], capture_output=True, text=True,
                           check=True).stdout
    for path in ("usr/lib/python3/dist-packages/tensorrt/__init__.py",
                 "usr/lib/python3/dist-packages/tensorrt-10.3.0.dist-info/METADATA", "usr/src/tensorrt/bin/trtexec"):
        assert path in files
    status = ""
    for deb in debs:
        control = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, check=True).stdout
        status += control.replace("Version:", "Status: install ok installed\nVersion:", 1) + "\n"
    assert parse_dpkg_status(status) == "10.3.0"  # what the device probe reads after dpkg -i
    module = (tmp_path / "python3-libnvinfer/usr/lib/python3/dist-packages/tensorrt/__init__.py").read_text()
    assert "STAND-IN" in module and '__version__ = "10.3.0"' in module


def test_tegrastats_standin_reports_this_machines_memory(tmp_path):
    """Synthesized from the board's own /proc/meminfo and the profile's figures, and parseable."""
    from cuvil_edge.telemetry.tegrastats import parse_tegrastats_line

    figures = tmp_path / "f.json"
    figures.write_text(json.dumps(board_figures("orin-nano-8gb")))
    proc = subprocess.Popen([sys.executable, str(HERE / "hil/standins/tegrastats"), "--interval", "100",
                             "--figures", str(figures)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()
    sample = parse_tegrastats_line(line.split(" ", 2)[2])
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    mem_total = int(next(ln for ln in meminfo if ln.startswith("MemTotal")).split()[1]) // 1024
    assert sample.ram_total_mb == mem_total and 0 < sample.ram_used_mb < mem_total
    assert set(sample.power_mw) == set(board_figures("orin-nano-8gb")["rails"])
    assert PERSONALITIES["orin-nano-8gb"].jetpack == "6.2"
