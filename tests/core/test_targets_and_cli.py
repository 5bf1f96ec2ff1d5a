"""Board profiles, the CLI's help and error contract, and the package's exported names."""

from __future__ import annotations

import importlib
import json
import pkgutil

import pytest

import cuvil_edge
from cuvil_edge.errors import CuvilEdgeError, InternalError, TargetError
from cuvil_edge.targets import all_targets, get_target


class TestTargets:
    def test_orin_is_neon_only_and_thor_has_128_bit_sve2(self):
        for name in ("agx-orin-64gb", "agx-orin-32gb", "orin-nx-16gb", "orin-nx-8gb", "orin-nano-8gb", "orin-nano-4gb"):
            t = get_target(name)
            assert t.isa == ("neon",) and t.sve_vector_bytes == 0, name
            assert t.gpu_sm == "8.7" and t.runtime_format == "tensorrt"
        thor = get_target("agx-thor")
        assert {"sve", "sve2"} <= set(thor.isa) and thor.sve_vector_bytes == 16

    def test_every_board_names_its_source_and_releases_carry_tensorrt(self):
        for t in all_targets().values():
            assert t.source
            for r in t.releases:
                assert r.l4t and r.tensorrt and r.cuda
        assert get_target("orin-nano-8gb").dla_cores == 0
        assert get_target("agx-orin-64gb").dla_cores == 2

    def test_cpu_only_boards_take_the_ort_format(self):
        assert get_target("generic-arm64").runtime_format == "ort-cpu"
        assert get_target("x86-host").runtime_format == "ort-cpu"
        assert get_target("x86-host").ram_bytes > 0

    def test_unknown_target_lists_known_ones(self):
        with pytest.raises(TargetError, match="unknown target 'orin-mega'.*orin-nano-8gb"):
            get_target("orin-mega")


class TestCli:
    def test_targets_json(self, cli):
        r = cli("targets", "--json")
        assert r.returncode == 0, r.stderr
        names = {t["name"] for t in json.loads(r.stdout)}
        assert {"agx-orin-64gb", "orin-nano-8gb", "agx-thor", "generic-arm64", "x86-host"} <= names

    @pytest.mark.parametrize(
        "command",
        ["targets", "keygen", "sign", "verify", "package", "inspect", "quantize", "validate", "demo"],
    )
    def test_every_command_has_help(self, cli, command):
        r = cli(command, "--help")
        assert r.returncode == 0, r.stderr
        assert "Usage" in r.stdout

    def test_user_error_is_one_line_exit_1_without_traceback(self, cli):
        r = cli("verify", "/nonexistent/bundle.cvb")
        assert r.returncode == 1
        assert "Traceback" not in r.stderr
        assert r.stderr.strip().count("\n") == 0
        assert "/nonexistent/bundle.cvb" in r.stderr


class TestPackageImports:
    def test_every_submodule_imports_without_extras(self):
        failures = []
        for mod in pkgutil.walk_packages(cuvil_edge.__path__, "cuvil_edge."):
            try:
                importlib.import_module(mod.name)
            except ImportError as exc:
                failures.append(f"{mod.name}: {exc}")
        assert not failures

    def test_errors_are_exported_in_their_tree(self):
        assert issubclass(cuvil_edge.BundleError, CuvilEdgeError)
        assert not issubclass(InternalError, CuvilEdgeError)


def test_typer_exit_codes_reach_the_shell():
    """A command ending in typer.Exit(2) must exit 2, not 0 (non-standalone click returns the code)."""
    import typer

    from cuvil_edge.cli import app, main

    @app.command("_exit-probe", hidden=True)
    def _probe() -> None:
        raise typer.Exit(2)

    try:
        assert main(["_exit-probe"]) == 2
    finally:
        app.registered_commands[:] = [c for c in app.registered_commands if c.name != "_exit-probe"]


def test_usage_error_exits_2_without_traceback(cli):
    r = cli("targets", "--no-such-flag")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and "No such option" in r.stderr


def test_error_text_with_brackets_survives(capsys):
    """Messages like 'pip install cuvil-edge[jetson]' must print verbatim, not as rich markup."""
    from cuvil_edge import cli as cli_mod
    from cuvil_edge.errors import ModelError

    @cli_mod.app.command("_bracket-probe", hidden=True)
    def _probe() -> None:
        raise ModelError("needs: pip install cuvil-edge[jetson]")

    try:
        assert cli_mod.main(["_bracket-probe"]) == 1
    finally:
        cli_mod.app.registered_commands[:] = [c for c in cli_mod.app.registered_commands if c.name != "_bracket-probe"]
    assert "cuvil-edge[jetson]" in capsys.readouterr().err
    # The shared console must still follow sys.stderr (a pinned file would hide later errors).
    assert cli_mod.err_console._file is None
