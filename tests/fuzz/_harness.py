"""The driver every fuzz target shares: seed corpus, libFuzzer flags, and what counts as a crash.

A target module defines ``test_one_input(data: bytes)`` that raises only for a defect (any
exception the product does not promise is a finding) and ``seeds()`` with real inputs to start
from. Run one with libFuzzer's flags::

    nice -n 10 python tests/fuzz/fuzz_tegrastats.py -runs=1000000 -max_len=8192 /tmp/corpus-tegrastats

An empty corpus directory is filled with the seeds first; crashes land in ``crash-*`` files in
the working directory (``-artifact_prefix=DIR/`` moves them).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import atheris

__all__ = ["REPO", "main"]

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # this checkout's cuvil_edge, whatever the working directory


def main(test_one_input: Callable[[bytes], None], seeds: Callable[[], Iterable[bytes]],
         argv: list[str] | None = None) -> None:
    """Write the seeds into empty corpus directories, then hand over to libFuzzer."""
    argv = list(sys.argv if argv is None else argv)
    inputs = [Path(a) for a in argv[1:] if not a.startswith("-")]
    corpora = [p for p in inputs if not p.is_file()]  # a file is an input to replay (a crash)
    for corpus in corpora:
        corpus.mkdir(parents=True, exist_ok=True)
        if not any(corpus.iterdir()):
            for i, seed in enumerate(seeds()):
                (corpus / f"seed-{i:03d}").write_bytes(seed)
    if not inputs:  # no corpus: still start from the seeds (libFuzzer reads -seed_inputs)
        tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"cuvil-fuzz-seeds-{os.getpid()}"
        tmp.mkdir(exist_ok=True)
        names = []
        for i, seed in enumerate(seeds()):
            (tmp / f"seed-{i:03d}").write_bytes(seed)
            names.append(str(tmp / f"seed-{i:03d}"))
        argv.append("-seed_inputs=" + ",".join(names))
    atheris.Setup(argv, test_one_input)
    atheris.Fuzz()
