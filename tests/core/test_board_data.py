"""Board facts live in data/targets.toml: clocks and power for the simulator, device-tree names for deploy."""

from __future__ import annotations

import ast
from dataclasses import asdict
from pathlib import Path

import pytest

import cuvil_edge
from cuvil_edge._toml import loads_toml
from cuvil_edge.errors import TargetError
from cuvil_edge.targets import BoardFigures, _parse, all_targets, profile_for_device_tree

PACKAGE = Path(cuvil_edge.__file__).resolve().parent
DATA = (PACKAGE / "data" / "targets.toml").read_text("utf-8")

# The figures as they were written in telemetry/sim.py before they moved to the data file; the
# simulator's output must not change with the move.
BEFORE = {
    "orin-nano-4gb": (625, 1510, 2133, 3000, 10000, ("VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"), True),
    "orin-nano-8gb": (625, 1510, 2133, 3500, 15000, ("VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"), True),
    "orin-nx-8gb": (765, 1984, 3199, 4000, 20000, ("VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"), True),
    "orin-nx-16gb": (918, 1984, 3199, 4500, 25000, ("VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"), True),
    "agx-orin-32gb": (930, 2188, 3199, 7000, 40000, ("VIN_SYS_5V0", "VDD_GPU_SOC", "VDD_CPU_CV"), True),
    "agx-orin-64gb": (1300, 2201, 3199, 8000, 60000, ("VIN_SYS_5V0", "VDD_GPU_SOC", "VDD_CPU_CV"), True),
    "xavier-nx": (1100, 1900, 1866, 3500, 20000, ("VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"), True),
    "agx-xavier": (1377, 2265, 2133, 6000, 30000, ("VDD_IN", "GPU", "CPU", "SOC"), True),
    "agx-thor": (1575, 2601, 4266, 25000, 130000, ("VIN", "VDD_GPU", "VDD_CPU_SOC_MSS"), False),
    "generic-arm64": (0, 2400, 2133, 2500, 12000, ("VDD_IN",), True),
    "x86-host": (0, 3000, 3200, 20000, 120000, ("VDD_IN",), True),
}


class TestClocksAndPower:
    def test_every_board_in_the_data_has_figures_the_simulator_reads(self):
        """Derived from the data, so a new board is a data change and no edit here."""
        from cuvil_edge.telemetry.sim import BOARD_FIGURES

        assert set(BOARD_FIGURES) == set(all_targets())
        for name, target in all_targets().items():
            assert target.figures is not None, name
            assert BOARD_FIGURES[name] is target.figures

    def test_the_boards_that_moved_keep_the_figures_they_had(self):
        from cuvil_edge.telemetry.sim import BOARD_FIGURES

        assert set(BEFORE) <= set(all_targets())  # boards are added, never silently dropped
        for name, figures in BEFORE.items():
            assert all_targets()[name].figures == BoardFigures(*figures), name
            assert BOARD_FIGURES[name] is all_targets()[name].figures
            # Types too: an int clock must not turn into 625.0 in the simulator's samples.
            assert [type(v) for v in asdict(BOARD_FIGURES[name]).values()] == \
                [type(v) for v in asdict(BoardFigures(*figures)).values()]

    def test_the_simulator_reads_them_from_the_profile(self):
        from cuvil_edge.telemetry.sim import SimulatedBoard

        sim = SimulatedBoard("agx-thor", speed=0)
        assert sim.figures.max_mw == 130000 and sim.figures.gpu_util_reported is False
        sample = sim.read()
        assert sample.gpu_util_pct is None  # Thor's tegrastats prints no GPU utilization
        assert list(sample.power_mw)[0] == sim.figures.rails[0] == "VIN"
        assert sample.emc_freq_mhz == 4266

    def test_no_board_figures_are_written_in_code(self):
        """The literal table is gone from the simulator: one home for board facts."""
        tree = ast.parse((PACKAGE / "telemetry" / "sim.py").read_text("utf-8"))
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "BoardFigures"]
        assert calls == []

    @pytest.mark.parametrize(("edit", "message"), [
        (("idle_mw = 3500\n", 'idle_mw = "a lot"\n'), "orin-nano-8gb.clocks_power' field 'idle_mw' must be number"),
        (("idle_mw = 3500\n", "idle_mw = 99000\n"), "idle_mw <= max_mw"),
        (("idle_mw = 3500\n", ""), "orin-nano-8gb.clocks_power' lacks field 'idle_mw'"),
        (('rails = ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"]\nsource = "Jetson Orin Nano Series Data Sheet DS-11105-001, '
          'power modes"\n\n[boards.orin-nano-4gb]', 'rails = []\nsource = "x"\n\n[boards.orin-nano-4gb]'),
         "field 'rails' must list rail names"),
    ])
    def test_bad_figures_name_the_board_and_field(self, edit, message):
        old, new = edit
        assert old in DATA
        with pytest.raises(TargetError, match=message.replace("[", r"\[").replace(".", r"\.")):
            _parse(loads_toml(DATA.replace(old, new, 1)))


class TestDeviceTree:
    @pytest.mark.parametrize(("model", "ram_mb", "want"), [
        ("NVIDIA Jetson Orin Nano Developer Kit", 7600, "orin-nano-8gb"),
        ("NVIDIA Jetson Orin Nano Developer Kit", 3500, "orin-nano-4gb"),
        ("NVIDIA Jetson Orin Nano Developer Kit", None, "orin-nano-8gb"),
        ("NVIDIA Jetson Orin NX Engineering Reference Developer Kit", 15300, "orin-nx-16gb"),
        ("NVIDIA Jetson Orin NX Engineering Reference Developer Kit", 7600, "orin-nx-8gb"),
        ("Jetson AGX Orin", 30000, "agx-orin-32gb"),
        ("NVIDIA Jetson AGX Thor Developer Kit", 125000, "agx-thor"),
        ("Jetson-AGX Xavier", 31000, "agx-xavier"),  # what older L4T releases write
        ("NVIDIA Jetson Nano Developer Kit", 3900, None),  # a module no profile describes: no guess
        ("NVIDIA Jetson AGX Xavier", 31000, "agx-xavier"),
        ("Raspberry Pi 5 Model B Rev 1.0", 8000, None),
    ])
    def test_profile_for_device_tree(self, model, ram_mb, want):
        assert profile_for_device_tree(model, ram_mb) == want

    def test_every_nvidia_module_names_its_device_tree_model(self):
        for target in all_targets().values():
            assert bool(target.device_tree_model) == target.has_gpu, target.name


class TestANewBoardIsOneTableEntry:
    """The CONTRIBUTING walkthrough "add a board": one [boards.NAME] table, nothing in code."""

    NEW = '''
[boards.example-orin-module]
title = "Example Orin module (a board added as data)"
arch = "aarch64"
cpu = "Cortex-A78AE"
cpu_cores = 6
isa = ["neon"]
sve_vector_bytes = 0
ram_gb = 8
mem_type = "LPDDR5"
mem_bandwidth_gbs = 68.0
gpu = "Ampere"
gpu_sm = "8.7"
gpu_sm_count = 8
integrated_gpu = true
dla_cores = 0
jetpack = ["6.2"]
device_tree_model = "Example Orin Module"
source = "test: a board added as data"

[boards.example-orin-module.clocks_power]
gpu_max_mhz = 1020
cpu_max_mhz = 1728
emc_max_mhz = 3199
idle_mw = 3000
max_mw = 25000
rails = ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"]
source = "test"
'''

    def test_the_data_alone_makes_it_known_to_targets_deploy_telemetry_and_recipes(self, monkeypatch):
        from cuvil_edge import targets
        from cuvil_edge.recipes import recipe_from_dict
        from cuvil_edge.telemetry.sim import SimulatedBoard

        boards = _parse(loads_toml(DATA + self.NEW))
        monkeypatch.setattr(targets, "all_targets", lambda: boards)
        new = targets.get_target("example-orin-module")
        assert new.runtime_format == "tensorrt" and new.releases[0].jetpack == "6.2"
        assert targets.profile_for_device_tree("NVIDIA Example Orin Module Developer Kit", 7600) == new.name
        sample = SimulatedBoard(new, speed=0).read()
        assert list(sample.power_mw)[0] == "VDD_IN" and sample.ram_total_mb > 7000
        recipe = recipe_from_dict({"name": "m", "model": {"source": "m.onnx"},
                                   "target": {"board": "example-orin-module", "precision": "int8"}}, "test")
        assert recipe.target == "example-orin-module"
