"""Fixtures for telemetry tests: recorded tegrastats lines, a tegrastats stand-in, a sysfs tree."""

from __future__ import annotations

import stat
import sys
import textwrap
from pathlib import Path

import pytest
from telemetry_helpers import DATA


@pytest.fixture
def tegrastats_data() -> Path:
    return DATA


@pytest.fixture
def fake_tegrastats(tmp_path: Path):
    """Make an executable that stands in for ``tegrastats`` on a machine without a Jetson.

    It replays recorded lines (tests/data/tegrastats) at ``--interval`` milliseconds, like the real
    tool, then exits with ``exit_code`` (the real tool runs until killed; ``repeat`` > 1 loops).
    """

    def make(lines: list[str], *, exit_code: int = 0, repeat: int = 1, stderr: str = "") -> Path:
        script = tmp_path / "tegrastats"
        body = f"""\
            #!{sys.executable}
            import sys, time
            args = sys.argv[1:]
            interval = int(args[args.index("--interval") + 1]) / 1000.0 if "--interval" in args else 1.0
            lines = {lines!r}
            for _ in range({repeat}):
                for line in lines:
                    print(line, flush=True)
                    time.sleep(interval)
            if {stderr!r}:
                print({stderr!r}, file=sys.stderr, flush=True)
            sys.exit({exit_code})
        """
        script.write_text(textwrap.dedent(body))
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
        return script

    return make


@pytest.fixture
def orin_sysfs(tmp_path: Path) -> Path:
    """A recorded-style sysfs/procfs tree of an Orin Nano under ``tmp_path/root``.

    File names and units follow the kernel ABI and JetPack 6 layout (meminfo in kB, cpufreq in kHz,
    devfreq in Hz, nvgpu load 0..1000, thermal in m°C, INA3221 hwmon in mV/mA).
    """
    root = tmp_path / "root"

    def w(rel: str, text: str) -> None:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)

    w(
        "proc/meminfo",
        "MemTotal:        7802900 kB\nMemFree:          812000 kB\nMemAvailable:    2802900 kB\n"
        "Buffers:           40000 kB\nCached:          1900000 kB\nSwapTotal:       3901440 kB\nSwapFree:        3801440 kB\n",
    )
    w("proc/stat", "cpu  100 0 100 800 0 0 0 0 0 0\n" + "".join(
        f"cpu{i} 10 0 10 80 0 0 0 0 0 0\n" for i in range(4)))
    for i in range(6):
        w(f"sys/devices/system/cpu/cpu{i}/online", "0\n" if i >= 4 else "1\n")
        if i < 4:
            w(f"sys/devices/system/cpu/cpu{i}/cpufreq/scaling_cur_freq", "1510400\n")
    w("sys/class/devfreq/17000000.ga10b/cur_freq", "624750000\n")
    w("sys/class/devfreq/17000000.ga10b/device/load", "453\n")
    for i, (kind, temp) in enumerate([("cpu-thermal", "47687"), ("gpu-thermal", "48625"), ("cv0-thermal", "-256000"), ("tj-thermal", "48625")]):
        w(f"sys/class/thermal/thermal_zone{i}/type", kind + "\n")
        w(f"sys/class/thermal/thermal_zone{i}/temp", temp + "\n")
    hw = "sys/class/hwmon/hwmon1"
    w(f"{hw}/name", "ina3221\n")
    for idx, (label, mv, ma) in enumerate([("VDD_IN", 5000, 900), ("VDD_CPU_GPU_CV", 5000, 100), ("VDD_SOC", 5000, 290)], start=1):
        w(f"{hw}/in{idx}_label", label + "\n")
        w(f"{hw}/in{idx}_input", f"{mv}\n")
        w(f"{hw}/curr{idx}_input", f"{ma}\n")
    return root


