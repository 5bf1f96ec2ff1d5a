"""The import rule between layers, proven to catch a planted upward import, and the drawn picture."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cuvil_edge
from cuvil_edge import _layers
from cuvil_edge._layers import (
    LAYERS,
    import_cycles,
    import_edges,
    layer_of,
    mermaid,
    private_imports,
    replace_picture,
    stale_allowances,
    violations,
)

PACKAGE = Path(cuvil_edge.__file__).resolve().parent
REPO = PACKAGE.parent


@pytest.fixture(scope="module")
def edges():
    return import_edges(PACKAGE)


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    """A copy of the real package's sources to plant imports in."""
    root = tmp_path / "cuvil_edge"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyc"))
    return root


def _plant(root: Path, relpath: str, line: str) -> None:
    path = root / relpath
    path.write_text(path.read_text("utf-8") + "\n" + line + "\n", "utf-8")


class TestThePackage:
    def test_no_module_imports_a_layer_above_or_beside_it(self, edges):
        assert len(edges) > 100  # the scan sees the package's real imports
        assert violations(edges) == []

    def test_the_allow_list_has_no_stale_entry(self, edges):
        assert stale_allowances(edges) == []

    def test_every_unit_of_the_package_is_in_a_layer(self):
        units = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
        units |= {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
        assert sorted(u for u in units if layer_of(u) is None) == []

    def test_the_daemon_imports_neither_packager_nor_deploy(self, edges):
        """Stated on its own, apart from LAYERS: a board install must not need the host's tools."""
        bad = [str(e) for e in edges if e.source_unit == "daemon" and e.target_unit in ("packager", "deploy")]
        assert bad == []

    def test_the_runtime_no_longer_imports_the_packager(self, edges):
        assert [str(e) for e in edges if e.source_unit == "runtime" and e.target_unit == "packager"] == []

    def test_no_module_imports_a_private_name_of_another(self):
        assert private_imports(PACKAGE) == []

    def test_no_import_cycle(self):
        assert import_cycles(PACKAGE) == []


class TestPrivateNamesAndCycles:
    def test_a_private_name_from_another_module_fails(self, tree):
        _plant(tree, "deploy/fleet.py", "from cuvil_edge.deploy.health import _sample  # noqa")
        _plant(tree, "deploy/probe.py", "from .transport import _reason  # noqa")
        problems = "\n".join(private_imports(tree))
        assert "deploy/fleet.py" in problems and "private name _sample of cuvil_edge.deploy.health" in problems
        assert "deploy/probe.py" in problems and "_reason of cuvil_edge.deploy.transport" in problems

    def test_a_package_importing_its_private_submodule_is_fine(self, tree):
        _plant(tree, "deploy/fleet.py", "from cuvil_edge.trt_plugins import _python  # noqa")
        assert private_imports(tree) == []

    def test_a_lazy_cycle_inside_one_unit_fails(self, tree):
        path = tree / "deploy/upload.py"
        path.write_text(path.read_text("utf-8") + "\n\ndef _late():\n    from cuvil_edge.deploy import fleet  # noqa\n")
        cycles = import_cycles(tree)
        assert any("cuvil_edge.deploy.upload" in c and "cuvil_edge.deploy.fleet" in c for c in cycles), cycles


class TestPlantedImports:
    def test_an_upward_import_fails(self, tree):
        assert violations(import_edges(tree)) == []
        _plant(tree, "telemetry/sample.py", "from cuvil_edge.packager.engine import EngineKey  # noqa")
        problems = violations(import_edges(tree))
        assert len(problems) == 1
        assert "telemetry/sample.py" in problems[0] and "'packager'" in problems[0] and "above it" in problems[0]

    def test_the_daemon_importing_deploy_fails(self, tree):
        _plant(tree, "daemon/server.py", "    import cuvil_edge.deploy.layout  # noqa")
        # The indented line is inside no block: make it a function so the file still parses.
        path = tree / "daemon/server.py"
        path.write_text(path.read_text().replace("\n    import cuvil_edge.deploy.layout", "\ndef _x():\n"
                                                 "    import cuvil_edge.deploy.layout"), "utf-8")
        problems = violations(import_edges(tree))
        assert len(problems) == 1 and "'deploy'" in problems[0] and "beside it" in problems[0]

    def test_relative_and_package_level_imports_are_seen(self, tree):
        _plant(tree, "bundle/manifest.py", "from ..daemon import store  # noqa")
        _plant(tree, "targets.py", "from cuvil_edge import telemetry  # noqa")
        _plant(tree, "sve/_ops.py", "import importlib; importlib.import_module('cuvil_edge.runtime.ort')")
        problems = "\n".join(violations(import_edges(tree)))
        assert "bundle/manifest.py" in problems and "'daemon'" in problems
        assert "targets.py" in problems and "'telemetry'" in problems
        assert "sve/_ops.py" in problems and "'runtime'" in problems

    def test_a_new_subpackage_must_be_placed(self, tree):
        (tree / "fleetview").mkdir()
        (tree / "fleetview" / "__init__.py").write_text("from cuvil_edge.errors import DeployError\n")
        problems = violations(import_edges(tree))
        assert len(problems) == 1 and "'fleetview' is in no layer" in problems[0]

    def test_the_allow_list_tolerates_what_it_names_and_nothing_more(self, tree):
        _plant(tree, "runtime/ort.py", "from cuvil_edge.packager import engine  # noqa")
        edges = import_edges(tree)
        allowed = {("cuvil_edge.runtime.ort", "packager"): "test: tolerated on purpose"}
        assert violations(edges, allowed) == []
        assert len(violations(edges, {})) == 1
        stale = {("cuvil_edge.runtime.trt", "packager"): "test: no such import any more"}
        assert stale_allowances(edges, stale) == ["cuvil_edge.runtime.trt -> packager"]

    def test_the_command_exits_1_naming_the_file(self, tree):
        _plant(tree, "runtime/buffers.py", "from cuvil_edge.deploy import layout  # noqa")
        proc = subprocess.run([sys.executable, "-m", "cuvil_edge._layers", "--check", "--root", str(tree)],
                              capture_output=True, text=True, timeout=120, cwd=REPO)
        assert proc.returncode == 1
        assert "runtime/buffers.py" in proc.stderr and "FAILED" in proc.stderr
        ok = subprocess.run([sys.executable, "-m", "cuvil_edge._layers", "--check"],
                            capture_output=True, text=True, timeout=120, cwd=REPO)
        assert ok.returncode == 0, ok.stderr


class TestPicture:
    def test_the_checked_in_picture_matches_the_code(self, edges):
        page = REPO / "docs" / "architecture.md"
        text = page.read_text("utf-8")
        assert replace_picture(text, mermaid(edges)) == text, (
            "docs/architecture.md is out of date: run python -m cuvil_edge._layers --write docs/architecture.md")

    def test_the_picture_changes_with_a_new_arrow(self, tree, edges):
        _plant(tree, "telemetry/sample.py", "from cuvil_edge.bundle import manifest  # noqa")
        assert mermaid(import_edges(tree)) != mermaid(edges)
        assert "telemetry -. allowed .-> bundle" not in mermaid(import_edges(tree))
        assert "telemetry --> bundle" in mermaid(import_edges(tree))

    def test_each_layer_is_a_subgraph(self, edges):
        picture = mermaid(edges)
        for layer in LAYERS:
            assert f"subgraph {layer.name}" in picture

    def test_missing_markers_are_an_error(self):
        with pytest.raises(ValueError, match="markers"):
            replace_picture("# no markers here\n", "flowchart TB\n")


def test_the_module_documents_how_to_redraw():
    assert "--write docs/architecture.md" in (_layers.__doc__ or "")
