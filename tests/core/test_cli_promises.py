"""Promises the CLI keeps for every command and option, new ones included (the tests walk them all).

* Every option reads ``CUVIL_EDGE_<COMMAND>_<NAME>``, then ``CUVIL_EDGE_<NAME>`` (README, ``cli.py``).
* ``--help`` shows defaults as a user types them, never ``PosixPath(...)``.
"""

from __future__ import annotations

import re

import pytest

from cuvil_edge.cli import build_command, main, walk_commands


def _expected(path: tuple[str, ...], flag: str) -> list[str]:
    """The rule, written out again here so that the test checks it rather than restating the code."""
    name = flag[2:].upper().replace("-", "_")
    scope = "_".join(p.upper().replace("-", "_") for p in path)
    return [f"CUVIL_EDGE_{scope}_{name}", f"CUVIL_EDGE_{name}"] if scope else [f"CUVIL_EDGE_{name}"]


COMMANDS = [(path, cmd) for path, cmd in walk_commands(build_command()) if path and not cmd.hidden]


def test_every_option_of_every_command_reads_the_two_names():
    checked = 0
    for path, command in COMMANDS:
        for param in command.params:
            if param.param_type_name != "option":
                continue
            flag = next(o for o in param.opts if o.startswith("--"))
            assert param.envvar == _expected(path, flag), (path, flag, param.envvar)
            checked += 1
    assert checked > 100  # every command's options, not a handful


def _context(path: tuple[str, ...], args: list[str]):
    command = build_command()
    for name in path:
        command = command.commands[name]
    return command.make_context(" ".join(path), args)


@pytest.mark.parametrize(("path", "args", "param", "env", "value"), [
    (("package",), ["m.onnx", "--out", "b.cvb"], "target", "CUVIL_EDGE_TARGET", "agx-thor"),
    (("package",), ["m.onnx", "--out", "b.cvb"], "target", "CUVIL_EDGE_PACKAGE_TARGET", "orin-nano-8gb"),
    (("deploy",), ["b.cvb"], "root", "CUVIL_EDGE_ROOT", "/srv/board"),
    (("engine", "build"), [], "root", "CUVIL_EDGE_ENGINE_BUILD_ROOT", "/srv/board"),
    (("top",), [], "token", "CUVIL_EDGE_DAEMON_TOKEN", "s3cret"),
])
def test_the_environment_reaches_the_option(monkeypatch, path, args, param, env, value):
    monkeypatch.setenv("CUVIL_EDGE_TARGET", "x86-host")  # the general name loses to the command's own
    monkeypatch.setenv("CUVIL_EDGE_ROOT", "/elsewhere")
    monkeypatch.setenv(env, value)
    assert _context(path, args).params[param] == value


def test_the_command_line_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv("CUVIL_EDGE_TARGET", "agx-thor")
    assert _context(("package",), ["m.onnx", "--out", "b.cvb", "--target", "x86-host"]).params["target"] == "x86-host"


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=" ".join)
def test_help_shows_plain_defaults(capsys, monkeypatch, path):
    monkeypatch.setenv("COLUMNS", "300")
    assert main([*path, "--help"]) == 0
    shown = capsys.readouterr().out
    assert "Usage" in shown
    assert not re.search(r"PosixPath|WindowsPath|<function|object at 0x", shown), shown


def test_daemon_help_shows_plain_defaults(capsys):
    from cuvil_edge.daemon.config import build_parser

    shown = build_parser().format_help()
    assert "PosixPath" not in shown and "default /var/lib/cuvil-edge]" in re.sub(r"\s+", " ", shown)
