"""The ``cuvil-edge`` command line. Each command is a thin call into one module.

Command groups live beside the code they drive (``packager/cli.py``, ``deploy/cli.py``, ...) and
register themselves here through ``register(app)``; every option also reads ``CUVIL_EDGE_<NAME>``.
Errors a user can cause end in one line on stderr and exit 1; startup failures exit 3.
"""

from __future__ import annotations

import importlib
import json
import sys

import typer
from rich.markup import escape
from rich.table import Table

from cuvil_edge._console import console, err_console, id_column, print_table
from cuvil_edge.errors import CuvilEdgeError

__all__ = ["app", "main", "console", "err_console"]

app = typer.Typer(
    name="cuvil-edge",
    help="Package, quantize, sign, serve and deploy models on Jetson and other ARM boards.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"auto_envvar_prefix": "CUVIL_EDGE"},
)

# Modules that add commands with ``register(app)``. Order is the order in --help.
_COMMAND_MODULES: tuple[str, ...] = (
    "cuvil_edge.packager.cli",
    "cuvil_edge.bundle.cli",
    "cuvil_edge.demo",
    "cuvil_edge.telemetry.cli",
    "cuvil_edge.deploy.cli",
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


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; user errors become one line and exit 1 instead of a traceback."""
    try:
        # In non-standalone mode click returns a typer.Exit's code instead of raising it.
        rc = app(args=argv, standalone_mode=False)
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
