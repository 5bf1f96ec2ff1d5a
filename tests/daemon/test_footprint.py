"""The daemon hands back the library pages loading read (cuvil_edge.daemon.footprint).

The page-out test runs on this machine's kernel in a child process: a file named like a shared
object, mapped and read there alone, must leave the resident set; a file named like a model,
mapped and read the same way, must stay.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cuvil_edge.daemon.footprint import library_ranges

MAPS = """\
7f0000000000-7f0000100000 r--p 00000000 fd:01 11 /usr/lib/libc.so.6
7f0000100000-7f0000200000 r-xp 00100000 fd:01 11 /usr/lib/libc.so.6
7f0000200000-7f0000201000 rw-p 00200000 fd:01 11 /usr/lib/libc.so.6
7f0000300000-7f0000400000 r-xp 00000000 fd:01 12 /venv/onnxruntime_pybind11_state.cpython-310-aarch64-linux-gnu.so
7f0000400000-7f0000500000 r--p 00000000 fd:01 13 /usr/lib/libpython3.10.so.1.0
7f0000500000-7f0000600000 r--s 00000000 fd:01 14 /store/bundles/yolo/2/model.onnx
7f0000600000-7f0000700000 rw-s 00000000 00:05 15 /dev/shm/cam0
7f0000700000-7f0000800000 rw-s 00000000 00:05 16 /dev/nvmap
7f0000800000-7f0000900000 r--s 00000000 00:05 17 /dev/nvhost-ctrl-gpu
7f0000900000-7f0000a00000 rw-p 00000000 00:00 0
7f0000a00000-7f0000b00000 r--p 00000000 fd:01 18 /usr/lib/libsomething.so.bak
"""


def test_library_ranges_are_read_only_shared_objects_only() -> None:
    got = library_ranges(MAPS)
    assert [(hex(lo), p.rsplit("/", 1)[1]) for lo, _, p in got] == [
        ("0x7f0000000000", "libc.so.6"),
        ("0x7f0000100000", "libc.so.6"),
        ("0x7f0000300000", "onnxruntime_pybind11_state.cpython-310-aarch64-linux-gnu.so"),
        ("0x7f0000400000", "libpython3.10.so.1.0"),
    ]  # not a library's data, a model's weights, shared memory, a device, or anonymous memory
    assert all(hi - lo == 0x100000 for lo, hi, _ in got)


CHILD = r"""
import json, mmap, sys
from cuvil_edge.daemon.footprint import page_out_libraries

def resident_kb(path):
    kb, inside = 0, False
    for line in open("/proc/self/smaps"):
        head = line.split()
        if head and "-" in head[0] and not head[0].endswith(":"):
            inside = len(head) > 5 and head[5] == path
        elif inside and head[0] == "Rss:":
            kb += int(head[1])
    return kb

maps = {}
for path in sys.argv[1:]:
    f = open(path, "rb")
    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    sum(m[i] for i in range(0, len(m), 4096))  # fault every page in
    maps[path] = m
before = {p: resident_kb(p) for p in maps}
freed = page_out_libraries()
after = {p: resident_kb(p) for p in maps}
print(json.dumps({"before": before, "after": after, "freed": freed}))
"""


def test_page_out_hands_back_library_pages_and_keeps_model_pages(tmp_path: Path) -> None:
    if not Path("/proc/self/smaps").exists():
        pytest.skip("no /proc/self/smaps (not Linux)")
    release = tuple(int(x) for x in re.findall(r"\d+", os.uname().release)[:2])
    if release < (5, 4):
        pytest.skip(f"kernel {os.uname().release} has no MADV_PAGEOUT (Linux 5.4)")
    lib, model = tmp_path / "libbig.so.1", tmp_path / "model.onnx"
    payload = bytes(range(256)) * (16 * 4096)  # 16 MiB, no zero pages for the kernel to share
    lib.write_bytes(payload)
    model.write_bytes(payload)
    out = subprocess.run([sys.executable, "-c", CHILD, str(lib), str(model)], capture_output=True, text=True,
                         timeout=120, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["before"][str(lib)] >= 15 * 1024 and got["before"][str(model)] >= 15 * 1024
    assert got["after"][str(lib)] < got["before"][str(lib)] // 4, got  # the library's pages went back
    assert got["after"][str(model)] == got["before"][str(model)], got  # the model's stayed
    assert got["freed"] >= 12 * 1048576, got
