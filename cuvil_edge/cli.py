"""The ``cuvil-edge`` command line. Each command is a thin call into one module.

Command groups live beside the code they drive (``packager/cli.py``, ``deploy/cli.py``, ...) and
register themselves here through ``register(app)``. Every option reads two environment variables,
by one rule applied here to every command (:func:`env_names`, so a new option needs no ``envvar=``):
``CUVIL_EDGE_<COMMAND>_<NAME>`` first, then ``CUVIL_EDGE_<NAME>``, where ``<COMMAND>`` is the
command's path (``engine build`` -> ``ENGINE_BUILD``) and ``<NAME>`` the option's long flag
(``--known-hosts`` -> ``KNOWN_HOSTS``). ``CUVIL_EDGE_IDENTITY`` thus serves every command that
takes ``--identity``; ``CUVIL_EDGE_DEPLOY_IDENTITY`` only ``deploy``.
Errors a user can cause end in one line on stderr and exit 1; startup failures exit 3.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import PurePath
from typing import Any

import typer
import typer.main
from rich.markup import escape
from rich.table import Table

from cuvil_edge._console import console, err_console, id_column, print_table
from cuvil_edge.errors import CuvilEdgeError

__all__ = ["ENV_PREFIX", "app", "build_command", "console", "env_names", "err_console", "main", "walk_commands"]

ENV_PREFIX = "CUVIL_EDGE"

app = typer.Typer(
    name="cuvil-edge",
    help="Package, quantize, sign, serve and deploy models on Jetson and other ARM boards.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Modules that add commands with ``register(app)``. Order is the order in --help.
_COMMAND_MODULES: tuple[str, ...] = (
    "cuvil_edge.packager.cli",
    "cuvil_edge.bundle.cli",
    "cuvil_edge.demo",
    "cuvil_edge.telemetry.cli",
    "cuvil_edge.deploy.cli",
    "cuvil_edge.daemon.store_cli",
    "cuvil_edge.top",
)


@app.command("targets")
def targets_cmd(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List the board profiles: CPU ISA, RAM, bandwidth, GPU SM, DLA cores, JetPack/TensorRT."""
    from cuvil_edge.targets import all_targets

    targets = all_targets()
    if as_json:
        print(json.dumps([t.to_dict() for t in targets.values()], indent=2))
        return
    table = Table(title="Board profiles")
    id_column(table, "name")
    for col in ("CPU", "cores", "ISA (SVE bytes)", "RAM GB", "GB/s", "SM", "DLA", "TensorRT"):
        table.add_column(col, overflow="fold")
    for t in targets.values():
        isa = ",".join(t.isa) + (f" ({t.sve_vector_bytes})" if t.sve_vector_bytes else "")
        trt = ", ".join(r.tensorrt for r in t.releases) or "-"
        table.add_row(
            t.name, t.cpu, str(t.cores), isa, f"{t.ram_bytes / 1024**3:.0f}",
            f"{t.mem_bandwidth_gbs:g}" if t.mem_bandwidth_gbs else "-", t.gpu_sm or "-",
            str(t.dla_cores), trt,
        )
    print_table(table)


def _build_on_devices(*args: object, **kwargs: object) -> None:
    """``engine build --on``: the packager's engine command hands its host side to deploy here,
    in the entry layer, so neither job imports the other (loaded only when --on is given)."""
    from cuvil_edge.deploy.engines_cli import build_on_devices

    build_on_devices(*args, **kwargs)


def _register_all() -> None:
    for name in _COMMAND_MODULES:
        module = importlib.import_module(name)
        if name == "cuvil_edge.packager.cli":
            module.register(app, build_on_devices=_build_on_devices)
        else:
            module.register(app)


_register_all()


def env_names(command_path: Sequence[str], option: Any) -> list[str]:
    """The environment variables an option reads, most specific first (the rule in the module docstring).

    Args:
        command_path (Sequence[str]): the command's names below ``cuvil-edge`` (``("engine", "build")``).
        option: the click option (its first ``--long`` flag names it).
    """
    flag = next((o for o in option.opts if o.startswith("--")), option.opts[0])
    name = flag.lstrip("-").upper().replace("-", "_")
    scope = "_".join(part.upper().replace("-", "_") for part in command_path)
    return [f"{ENV_PREFIX}_{scope}_{name}", f"{ENV_PREFIX}_{name}"] if scope else [f"{ENV_PREFIX}_{name}"]


def walk_commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command under ``command`` (itself first) with its path of names."""
    yield path, command
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from walk_commands(sub, (*path, name))


def build_command() -> Any:
    """The click command of :data:`app` with the promises the CLI keeps applied to every option:
    the environment rule (:func:`env_names`) and defaults shown as a user writes them (a path as
    ``cuvil-demo``, not ``PosixPath('cuvil-demo')``)."""
    root = typer.main.get_command(app)
    for path, command in walk_commands(root):
        for param in command.params:
            if param.param_type_name != "option":
                continue
            param.envvar = env_names(path, param)
            param.show_envvar = True
            if isinstance(param.default, PurePath):
                param.default = str(param.default)  # converted back to a Path like a typed value
    return root


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; user errors become one line and exit 1 instead of a traceback."""
    try:
        # In non-standalone mode click returns a typer.Exit's code instead of raising it.
        rc = build_command().main(args=argv, prog_name="cuvil-edge", standalone_mode=False)
        if isinstance(rc, int) and not isinstance(rc, bool):
            return rc
    except CuvilEdgeError as exc:
        # escape(): messages name things like "cuvil-edge[jetson]" that rich would read as markup.
        err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return 1
    except typer.Exit as exc:
        return int(exc.exit_code or 0)
    except typer.Abort:
        err_console.print("aborted")
        return 130
    except Exception as exc:
        # Usage errors are click exceptions; typer may vendor click (typer._click), so match by shape.
        show, code = getattr(exc, "show", None), getattr(exc, "exit_code", None)
        if callable(show) and isinstance(code, int):
            show()
            return code
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
