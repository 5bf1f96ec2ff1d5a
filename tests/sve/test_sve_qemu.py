"""aarch64 proofs under qemu-user: the self-test and the Python kernel cases on every CPU model of
hil.qemu_user.CPU_MODELS, ISA forcing, no SVE outside SVE files, symbol names."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hil import qemu_user

REPO = Path(__file__).resolve().parents[2]
MODELS = {m.name: m for m in qemu_user.CPU_MODELS}
OPS = ("normalize", "resize_normalize", "quantize", "dequantize", "softmax_topk", "nms_decode", "nms_suppress")
KERNEL_RE = re.compile(r"^cuvil_(" + "|".join(OPS) + r")_(f32|f16|s8|s32|u8)_(f32|f16|s8|u8)_(scalar|neon|sve|sve2)$")
PUBLIC = {"cuvil_abi_version", "cuvil_init_status", "cuvil_init_message", "cuvil_isa_for", "cuvil_isa_available",
          "cuvil_sve_vector_bytes", "cuvil_select_isa", "cuvil_set_threads", "cuvil_get_threads",
          "cuvil_normalize", "cuvil_resize_normalize",
          "cuvil_quantize", "cuvil_dequantize", "cuvil_softmax_topk", "cuvil_nms"}


def _expected_isas(model: qemu_user.CpuModel) -> list[str]:
    return ["scalar", "neon"] + (["sve", "sve2"] if model.vector_bytes else [])


@pytest.mark.hil
@pytest.mark.parametrize("name", list(MODELS))
def test_selftest_on_cpu_model(aarch64_build, name):
    model = MODELS[name]
    p = qemu_user.run([str(aarch64_build / "cuvil_sve_selftest"), "2"], model.cpu)
    assert p.returncode == 0, p.stdout + p.stderr
    head = p.stdout.splitlines()[0]
    assert f"isa {model.best_isa}, vector length {model.vector_bytes} bytes" in head, head
    assert "available: " + " ".join(_expected_isas(model)) in head, head
    last = p.stdout.splitlines()[-1]
    assert last.startswith("PASSED") and " 0 mismatches" in last, p.stdout[-2000:]
    checks = int(re.search(r"(\d+) checks", last).group(1))
    assert checks > (2500 if model.vector_bytes else 1000)


@pytest.mark.hil
@pytest.mark.parametrize("cpu,force,want", [
    ("cortex-a76", "sve", "lacks sve"),
    ("max,sve=off", "sve2", "lacks sve2"),
    ("cortex-a76", "avx2", "not an ISA"),
    ("max,sve-default-vector-length=16", "sve", "isa sve (forced)"),
    ("max,sve-default-vector-length=32", "neon", "isa neon (forced)"),
])
def test_force_isa_under_qemu(aarch64_build, cpu, force, want):
    p = qemu_user.run([str(aarch64_build / "cuvil_sve_selftest"), "1"], cpu, env={"CUVIL_FORCE_ISA": force})
    if want.startswith("isa "):
        assert p.returncode == 0, p.stdout + p.stderr
        # The self-test reports the ISA the dispatch table held at load.
        assert f"isa {force}," in p.stdout.splitlines()[0]
    else:
        assert p.returncode == 2, p.stdout + p.stderr
        assert want in p.stderr and "CUVIL_FORCE_ISA" in p.stderr


def _tool(name: str) -> str:
    path = shutil.which(f"aarch64-linux-gnu-{name}")
    assert path, f"aarch64-linux-gnu-{name} missing: apt-get install binutils-aarch64-linux-gnu"
    return path


SVE_INSN = re.compile(r"\bz\d{1,2}\.[bhsdq]\b|\bp\d{1,2}(/[zm]|\.[bhsd])\b|\b(rdvl|addvl|ptrue|whilelo|whilelt|"
                      r"cnt[bhwd]|inc[bhwd])\b")


def test_no_sve_outside_sve_files(aarch64_build):
    """Orin is NEON-only: SVE instructions may only appear in *_sve / *_sve2 functions."""
    out = subprocess.run([_tool("objdump"), "-d", "--no-show-raw-insn", str(aarch64_build / "libcuvil_sve.so")],
                         capture_output=True, text=True, check=True).stdout
    func, offenders, sve_funcs = "", {}, set()
    for line in out.splitlines():
        m = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        if m:
            func = m.group(1)
            continue
        if SVE_INSN.search(line.split(";")[0]):
            if re.search(r"_sve2?(\.|$)|^cuvil_sve_cntb$", func):
                sve_funcs.add(func)
            else:
                offenders.setdefault(func, line.strip())
    assert not offenders, f"SVE instructions outside SVE files: {offenders}"
    assert any(f.endswith("_sve2") for f in sve_funcs) and any(f.endswith("_sve") for f in sve_funcs)


def test_symbol_names(aarch64_build):
    lib = str(aarch64_build / "libcuvil_sve.so")
    dyn = subprocess.run([_tool("nm"), "-D", "--defined-only", lib], capture_output=True, text=True,
                         check=True).stdout
    exported = {ln.split()[-1] for ln in dyn.splitlines() if " T " in ln}
    assert exported == PUBLIC, f"exported symbols differ: {exported ^ PUBLIC}"
    syms = subprocess.run([_tool("nm"), lib], capture_output=True, text=True, check=True).stdout
    kernels = {ln.split()[-1] for ln in syms.splitlines()
               if re.search(r" cuvil_\w+_(scalar|neon|sve|sve2)$", ln)}
    bad = sorted(k for k in kernels if not KERNEL_RE.match(k))
    assert not bad, f"kernel symbols outside the grammar cuvil_<op>_<dst>_<src>_<isa>: {bad}"
    for op in OPS:
        for isa in ("scalar", "neon", "sve", "sve2"):
            assert any(k.startswith(f"cuvil_{op}_") and k.endswith(f"_{isa}") for k in kernels), (op, isa)


@pytest.fixture(scope="session")
def rootfs() -> Path:
    """arm64 Debian bookworm root file system with python3 + numpy (built once, cached).

    If it cannot be made (no mirror, no debootstrap) this fails loudly: the aarch64 Python proof
    is part of the suite, not optional."""
    return qemu_user.ensure_rootfs()


@pytest.mark.slow
@pytest.mark.hil
@pytest.mark.parametrize("name", list(MODELS))
def test_python_cases_on_cpu_model(aarch64_build, rootfs, name):
    model = MODELS[name]
    p = qemu_user.run([str(rootfs / "usr" / "bin" / "python3"), str(REPO / "tests" / "sve" / "sve_kernel_cases.py")],
                      model.cpu, rootfs=rootfs, env={"PYTHONDONTWRITEBYTECODE": "1"}, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    for isa in _expected_isas(model):
        assert f"PASSED isa={isa} vector_bytes={model.vector_bytes} platform=linux-aarch64" in p.stdout, p.stdout
    assert "FAILED" not in p.stdout


@pytest.mark.slow
@pytest.mark.hil
def test_python_force_isa_refused_on_orin_model(aarch64_build, rootfs):
    code = "from cuvil_edge import sve; sve.cpu_info()"
    p = qemu_user.run([str(rootfs / "usr" / "bin" / "python3"), "-c", code], "cortex-a76", rootfs=rootfs,
                      env={"CUVIL_FORCE_ISA": "sve2", "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"})
    assert p.returncode != 0
    assert "KernelError" in p.stderr and "lacks sve2" in p.stderr
