"""The consoles every command prints through, and how tables reach a pipe whole.

Sub-CLIs (``packager/cli.py``, ``deploy/cli.py``, ...) take their consoles from here rather than
from :mod:`cuvil_edge.cli`: importing the top-level CLI back would run its registration of every
command group and draw an arrow from a lower layer up to the entry point.

Tables: rich fits a table to the console width, cutting cells to ``orin-n…`` when the output is a
pipe (80 columns, or ``COLUMNS``) or a narrow terminal. An id cut that way can be neither read nor
grepped, so :func:`print_table` prints at the table's natural width when the output is not a
terminal, and :func:`id_column` marks id columns ``no_wrap`` so a narrow terminal keeps them whole
and squeezes the other columns instead. ``--json`` remains the format for scripts.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

__all__ = ["console", "err_console", "id_column", "print_table"]

console = Console()
err_console = Console(stderr=True)


def id_column(table: Table, header: str, **kwargs: Any) -> None:
    """Add a column of identifiers (board, device, node, file names) that rich never cuts.

    Args:
        table (Table): the table to add the column to.
        header (str): the column header.
        **kwargs: further :meth:`rich.table.Table.add_column` options.
    """
    table.add_column(header, no_wrap=True, **kwargs)


def print_table(table: Table, out: Console | None = None) -> None:
    """Print ``table`` without cutting cells when the output is not a terminal.

    Args:
        table (Table): the table to print.
        out (Console | None): the console to print on. Defaults to :data:`console`.
    """
    out = out or console
    if out.is_terminal:
        out.print(table)
        return
    # Console.print(width=...) can only narrow the output, so a wider copy of the console prints
    # the table at its natural width; the file is read at print time, so captured output works.
    natural = Measurement.get(out, out.options.update(max_width=1 << 16), table).maximum
    wide = Console(file=out.file, width=max(natural, out.width), color_system=out.color_system,
                   no_color=out.no_color, force_terminal=False)
    wide.print(table)
