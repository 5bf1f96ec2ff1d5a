"""tritonclient is an extra: a board install imports without it, the load generator names the extra."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import cuvil_edge
from cuvil_edge._toml import loads_toml

PACKAGE = Path(cuvil_edge.__file__).resolve().parent
REPO = PACKAGE.parent

# A meta-path hook that makes ``import tritonclient`` fail as on a board without the extra.
_BLOCK = """
import sys
class _NoTriton:
    def find_spec(self, name, path=None, target=None):
        if name == "tritonclient" or name.startswith("tritonclient."):
            raise ImportError("No module named 'tritonclient' (blocked by the test)")
        return None
sys.meta_path.insert(0, _NoTriton())
"""


@pytest.fixture()
def no_tritonclient(monkeypatch):
    for name in [m for m in sys.modules if m == "tritonclient" or m.startswith("tritonclient.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "tritonclient", None)
    monkeypatch.setitem(sys.modules, "tritonclient.http", None)


def test_pyproject_makes_tritonclient_an_extra():
    project = loads_toml((REPO / "pyproject.toml").read_text("utf-8"))["project"]
    assert not [d for d in project["dependencies"] if d.startswith("tritonclient")]
    extras = project["optional-dependencies"]
    def http_client(deps: list[str]) -> bool:
        return any(d.startswith("tritonclient[") and "http" in d.split("[")[1].split("]")[0] for d in deps)

    assert http_client(extras["client"])
    assert http_client(extras["dev"])  # scripts/bootstrap.sh installs .[dev], the demo included


def test_only_the_load_generator_imports_tritonclient():
    importers = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "optional_import" and node.args \
                    and isinstance(node.args[0], ast.Constant):
                names = [str(node.args[0].value)]  # cuvil_edge._optional.optional_import("tritonclient.http")
            if any(n == "tritonclient" or n.startswith("tritonclient.") for n in names):
                importers.add(path.relative_to(PACKAGE).as_posix())
    assert importers == {"loadgen.py"}


def test_every_module_and_the_daemon_start_without_tritonclient():
    code = _BLOCK + """
import importlib, pkgutil, cuvil_edge
for mod in pkgutil.walk_packages(cuvil_edge.__path__, "cuvil_edge."):
    importlib.import_module(mod.name)
from cuvil_edge.daemon.main import main
try:
    main(["--help"])
except SystemExit as exc:
    assert exc.code == 0, exc.code
import tritonclient
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    # Everything imported and --help ran; only the final, deliberate import of tritonclient failed.
    assert proc.returncode == 1, proc.stderr
    assert "usage:" in proc.stdout.lower()
    assert proc.stderr.strip().splitlines()[-1].startswith("ImportError: No module named 'tritonclient'")


def test_the_load_generator_names_the_extra(no_tritonclient, tmp_path):
    from cuvil_edge.errors import CuvilEdgeError
    from cuvil_edge.loadgen import ClientMissing, serve_and_measure

    with pytest.raises(ClientMissing, match=r"pip install 'cuvil-edge\[client\]'") as info:
        serve_and_measure(tmp_path, requests=1)
    assert isinstance(info.value, CuvilEdgeError)


def test_the_demo_skips_serving_without_the_extra(no_tritonclient, tmp_path, capsys):
    from cuvil_edge.demo import _serve

    assert _serve(tmp_path, "orin-nano-8gb", 5) is None
    out = capsys.readouterr().out
    assert "skipping the serving step" in out and "cuvil-edge[client]" in out
