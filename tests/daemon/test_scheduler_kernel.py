"""The kernel's memory signals: /proc/meminfo, PSI, the memory cgroup (v1 and v2), on this host's
real /proc and on fixture trees, and how the memory scheduler's ladder answers them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cuvil_edge.daemon.scheduler import KernelMemory, MemoryScheduler, PressureLevel
from cuvil_edge.daemon.scheduler.kernel import (
    find_memory_cgroup,
    read_cgroup_memory,
    read_meminfo,
    read_pressure,
)

MiB = 1024 * 1024

MEMINFO = """MemTotal:        8000000 kB
MemFree:          300000 kB
MemAvailable:    1000000 kB
Buffers:           10000 kB
SwapTotal:       4000000 kB
SwapFree:        3000000 kB
"""
PSI = """some avg10=12.50 avg60=3.20 avg300=0.80 total=1234567
full avg10=1.25 avg60=0.30 avg300=0.05 total=234567
"""


def _tree(root: Path, *, v2: bool = True, current: int = 900 * MiB, limit: str = str(1024 * MiB),
          oom_kill: int = 0, psi: str | None = PSI) -> Path:
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/meminfo").write_text(MEMINFO)
    if psi is not None:
        (root / "proc/pressure").mkdir()
        (root / "proc/pressure/memory").write_text(psi)
    if v2:
        (root / "proc/self/cgroup").write_text("0::/system.slice/cuvil-edged.service\n")
        cg = root / "sys/fs/cgroup/system.slice/cuvil-edged.service"
        cg.mkdir(parents=True)
        (cg / "memory.current").write_text(f"{current}\n")
        (cg / "memory.max").write_text(f"{limit}\n")
        (cg / "memory.events").write_text(f"low 0\nhigh 3\nmax 7\noom 2\noom_kill {oom_kill}\n")
    else:
        (root / "proc/self/cgroup").write_text("9:name=systemd:/\n4:memory:/cuvil\n0::/\n")
        cg = root / "sys/fs/cgroup/memory/cuvil"
        cg.mkdir(parents=True)
        (cg / "memory.usage_in_bytes").write_text(f"{current}\n")
        (cg / "memory.limit_in_bytes").write_text(("9223372036854771712" if limit == "max" else limit) + "\n")
        (cg / "memory.oom_control").write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {oom_kill}\n")
    return cg


class TestReaders:
    def test_meminfo_in_bytes(self, tmp_path: Path) -> None:
        _tree(tmp_path)
        info = read_meminfo(tmp_path)
        assert info["MemTotal"] == 8000000 * 1024 and info["MemAvailable"] == 1000000 * 1024

    def test_pressure(self, tmp_path: Path) -> None:
        _tree(tmp_path)
        p = read_pressure(tmp_path)
        assert p is not None and (p.some_avg10, p.full_avg10, p.some_total_us) == (12.5, 1.25, 1234567)

    def test_no_psi_is_none_not_zero(self, tmp_path: Path) -> None:
        _tree(tmp_path, psi=None)
        assert read_pressure(tmp_path) is None
        assert KernelMemory(tmp_path).read().pressure is None

    @pytest.mark.parametrize("v2", [True, False])
    def test_cgroup_found_and_read(self, tmp_path: Path, v2: bool) -> None:
        cg = _tree(tmp_path, v2=v2, oom_kill=1)
        assert find_memory_cgroup(tmp_path) == cg
        r = read_cgroup_memory(cg)
        assert r is not None and r.version == (2 if v2 else 1)
        assert (r.current, r.limit, r.oom_kills) == (900 * MiB, 1024 * MiB, 1)

    @pytest.mark.parametrize("v2", [True, False])
    def test_unlimited_cgroup_has_no_limit(self, tmp_path: Path, v2: bool) -> None:
        cg = _tree(tmp_path, v2=v2, limit="max")
        r = read_cgroup_memory(cg)
        assert r is not None and r.limit is None

    @pytest.mark.parametrize("v2", [True, False])
    def test_inactive_page_cache_is_not_pressure(self, tmp_path: Path, v2: bool) -> None:
        """A hog that wrote files leaves page cache charged to the cgroup; the kernel reclaims it
        before any OOM kill, so it does not count against what is left."""
        cg = _tree(tmp_path, v2=v2, current=1000 * MiB, limit=str(1024 * MiB))
        key = "inactive_file" if v2 else "total_inactive_file"
        (cg / "memory.stat").write_text(f"anon 1\n{key} {600 * MiB}\nactive_file 5\n")
        r = KernelMemory(tmp_path).read()
        assert r.cgroup is not None and r.cgroup.working_set == 400 * MiB
        assert r.available_bytes == 624 * MiB

    def test_a_cgroup_limit_tighter_than_ram_is_the_ram(self, tmp_path: Path) -> None:
        _tree(tmp_path, current=900 * MiB, limit=str(1024 * MiB))
        r = KernelMemory(tmp_path).read()
        assert r.limited_by_cgroup and r.total_bytes == 1024 * MiB
        assert r.available_bytes == 124 * MiB  # limit - usage, less than MemAvailable (977 MiB)
        s = KernelMemory(tmp_path).sample(r)
        assert s.ram_total_mb == 1024 and s.ram_free_mb == pytest.approx(124)
        assert s.swap_used_mb == pytest.approx((4000000 - 3000000) / 1024)


@pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="needs Linux /proc")
class TestThisHost:
    def test_reads_the_real_kernel(self) -> None:
        k = KernelMemory()
        r = k.read()
        info = read_meminfo()
        assert r.total_bytes is not None and 0 < r.total_bytes <= info["MemTotal"]
        assert r.available_bytes is not None and 0 <= r.available_bytes <= r.total_bytes
        if os.path.exists("/proc/pressure/memory"):
            assert r.pressure is not None and 0.0 <= r.pressure.some_avg10 <= 100.0
        if k.cgroup_dir is not None:
            assert r.cgroup is not None and r.cgroup.current and r.cgroup.current > 0


class TestLadderAnswersTheKernel:
    def _sched(self, root: Path) -> MemoryScheduler:
        return MemoryScheduler(total_bytes=8192 * MiB, reserve_mb=256, kernel=KernelMemory(root))

    def test_update_without_telemetry_uses_the_kernel(self, tmp_path: Path) -> None:
        _tree(tmp_path, current=1000 * MiB, limit=str(1024 * MiB), psi=None)
        s = self._sched(tmp_path)
        level = s.update(None)
        # 24 MiB free of a 1 GiB cgroup: 2.3% free -> UNLOAD_LRU
        assert level == PressureLevel.UNLOAD_LRU and "free RAM 2.3%" in s.reason
        assert s.snapshot()["kernel"]["limited_by_cgroup"] is True

    def test_psi_some_raises_one_step(self, tmp_path: Path) -> None:
        _tree(tmp_path, current=100 * MiB, limit="max")
        s = self._sched(tmp_path)
        assert s.update(None) == PressureLevel.SHRINK_PREFETCH and "PSI some 12.5%" in s.reason

    def test_psi_full_asks_to_unload(self, tmp_path: Path) -> None:
        _tree(tmp_path, current=100 * MiB, limit="max",
              psi="some avg10=40.00 avg60=10 avg300=1 total=1\nfull avg10=9.00 avg60=2 avg300=0 total=1\n")
        s = self._sched(tmp_path)
        assert s.update(None) == PressureLevel.UNLOAD_LRU and "PSI full 9.0%" in s.reason

    def test_an_oom_kill_in_the_cgroup_holds_reject(self, tmp_path: Path) -> None:
        cg = _tree(tmp_path, current=100 * MiB, limit="max", psi=None)
        now = [0.0]
        s = MemoryScheduler(total_bytes=8192 * MiB, reserve_mb=256, kernel=KernelMemory(tmp_path),
                            clock=lambda: now[0])
        assert s.update(None) == PressureLevel.NORMAL
        (cg / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 3\noom_kill 1\n")
        now[0] = 1.0
        assert s.update(None) == PressureLevel.REJECT and s.should_reject()
        for k in range(20):  # after oom_kill_hold_s the ladder comes down a step at a time
            now[0] = 5.0 + k
            s.update(None)
        assert s.level == PressureLevel.NORMAL

    def test_kernel_tightens_a_telemetry_sample(self, tmp_path: Path) -> None:
        from cuvil_edge.telemetry import Sample

        _tree(tmp_path, current=1000 * MiB, limit=str(1024 * MiB), psi=None)
        s = self._sched(tmp_path)
        roomy = Sample(timestamp=1.0, ram_used_mb=2000.0, ram_total_mb=8192.0)
        assert s.update(roomy) == PressureLevel.UNLOAD_LRU  # the cgroup has 24 MiB left
