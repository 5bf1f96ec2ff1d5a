"""The daemon hands back the library pages loading read (cuvil_edge.daemon.footprint).

The page-out test runs on this machine's kernel in a child process: a file named like a shared
object, mapped and read there alone, must leave the resident set; a file named like a model,
mapped and read the same way, must stay, and so must a library's private, relocated copy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cuvil_edge.daemon.footprint import library_ranges


def _mapping(span: str, perms: str, path: str, anon: int = 0, shared: int = 0, private_dirty: int = 0) -> str:
    return (f"{span} {perms} 00000000 fd:01 11 {path}\nSize: 1024 kB\nRss: 512 kB\nShared_Clean: {shared} kB\n"
            f"Shared_Dirty: 0 kB\nPrivate_Clean: 512 kB\nPrivate_Dirty: {private_dirty} kB\nAnonymous: {anon} kB\n"
            "VmFlags: rd mr mw me\n")


SMAPS = "".join([
    _mapping("7f0000000000-7f0000100000", "r--p", "/usr/lib/libc.so.6"),
    _mapping("7f0000100000-7f0000200000", "r-xp", "/usr/lib/libc.so.6"),
    _mapping("7f0000200000-7f0000201000", "r--p", "/usr/lib/libc.so.6", anon=4, private_dirty=4),  # relocated
    _mapping("7f0000201000-7f0000202000", "rw-p", "/usr/lib/libc.so.6", anon=4, private_dirty=4),
    _mapping("7f0000300000-7f0000400000", "r-xp", "/venv/onnxruntime_pybind11_state.cpython-310-aarch64-linux-gnu.so"),
    _mapping("7f0000400000-7f0000500000", "r--p", "/usr/lib/libpython3.10.so.1.0"),
    _mapping("7f0000480000-7f0000490000", "r-xp", "/usr/lib/libnumpy_shared.so", shared=64),  # the client maps it too
    _mapping("7f0000500000-7f0000600000", "r--s", "/store/bundles/yolo/2/model.onnx"),
    _mapping("7f0000600000-7f0000700000", "rw-s", "/dev/shm/cam0"),
    _mapping("7f0000700000-7f0000800000", "rw-s", "/dev/nvmap"),
    _mapping("7f0000800000-7f0000900000", "r--s", "/dev/nvhost-ctrl-gpu"),
    "7f0000900000-7f0000a00000 rw-p 00000000 00:00 0\nRss: 4 kB\nAnonymous: 4 kB\n",
    _mapping("7f0000a00000-7f0000b00000", "r--p", "/usr/lib/libsomething.so.bak"),
])


def test_library_ranges_are_unshared_clean_shared_objects_only() -> None:
    got = library_ranges(SMAPS)
    assert [(hex(lo), p.rsplit("/", 1)[1]) for lo, _, p in got] == [
        ("0x7f0000000000", "libc.so.6"),
        ("0x7f0000100000", "libc.so.6"),
        ("0x7f0000300000", "onnxruntime_pybind11_state.cpython-310-aarch64-linux-gnu.so"),
        ("0x7f0000400000", "libpython3.10.so.1.0"),
    ]  # not relocated data, a library's data, a shared mapping, a model's weights, shared memory, a device
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
for path in sys.argv[1:3]:
    f = open(path, "rb")
    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    sum(m[i] for i in range(0, len(m), 4096))  # fault every page in
    maps[path] = m
# A library's relocated read-only data: a private copy written once, then made read-only.
import ctypes
cow_path = sys.argv[3]
f = open(cow_path, "rb")
cow = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
cow[0:4] = b"RELO"
addr = ctypes.addressof(ctypes.c_char.from_buffer(cow))
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
assert libc.mprotect(addr, len(cow), mmap.PROT_READ) == 0
maps[cow_path] = cow
before = {p: resident_kb(p) for p in maps}
freed = page_out_libraries()
after = {p: resident_kb(p) for p in maps}
print(json.dumps({"before": before, "after": after, "freed": freed, "cow": cow[0:4].decode()}))
"""


def test_page_out_hands_back_library_pages_and_keeps_model_pages(tmp_path: Path) -> None:
    if not Path("/proc/self/smaps").exists():
        pytest.skip("no /proc/self/smaps (not Linux)")
    lib, model, cow = tmp_path / "libbig.so.1", tmp_path / "model.onnx", tmp_path / "librelro.so"
    payload = bytes(range(256)) * (16 * 4096)  # 16 MiB, no zero pages for the kernel to share
    lib.write_bytes(payload)
    model.write_bytes(payload)
    cow.write_bytes(payload[: 1 << 20])
    for f in (lib, model, cow):  # written back, as an installed library is: dirty pages count as our own
        fd = os.open(f, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    out = subprocess.run([sys.executable, "-c", CHILD, str(lib), str(model), str(cow)], capture_output=True,
                         text=True, timeout=120, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["before"][str(lib)] >= 15 * 1024 and got["before"][str(model)] >= 15 * 1024
    assert got["after"][str(lib)] < got["before"][str(lib)] // 4, got  # the library's pages went back
    assert got["after"][str(model)] == got["before"][str(model)], got  # the model's stayed
    assert got["freed"] >= 12 * 1048576, got
    assert got["cow"] == "RELO", got  # a private copy is never dropped (it would read back the file's bytes)
    assert got["after"][str(cow)] == got["before"][str(cow)], got
    if shutil.which("fincore"):  # util-linux: the page cache dropped the library's pages, not only our mapping
        cached = subprocess.run(["fincore", "--bytes", "--noheadings", "-o", "RES", str(lib)], capture_output=True,
                                text=True, check=True).stdout.split()
        assert int(cached[0]) < len(payload) // 4, cached
