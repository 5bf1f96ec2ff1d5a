"""Rich progress for long packaging work: a status line plus a bar per counted task."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

__all__ = ["packaging_progress"]

# Messages worth keeping on screen after the bar is gone.
_KEEP = ("warning", "kept", "INT8 meets", "no evaluation")


@contextlib.contextmanager
def packaging_progress(console: Console) -> Iterator[tuple[Callable[[str], None], Callable[[str, int, int], None]]]:
    """Yields ``say(msg)`` for the status line and ``bar(task, done, total)`` for counted steps."""
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=True,
    ) as progress:
        status = progress.add_task("packaging", total=None)
        bars: dict[str, int] = {}

        def say(msg: str) -> None:
            progress.update(status, description=msg)
            if msg.startswith(_KEEP):
                progress.console.print(f"  {msg}", highlight=False)

        def bar(task: str, done: int, total: int) -> None:
            if task not in bars:
                bars[task] = progress.add_task(task, total=total)
            progress.update(bars[task], completed=done, total=total)

        yield say, bar
