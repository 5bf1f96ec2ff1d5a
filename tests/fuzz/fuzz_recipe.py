"""Fuzz target: the recipe loader (TOML text to a validated Recipe).

Promise: a recipe parses, or the loader raises a CuvilEdgeError (RecipeError, TargetError) or
TOML's own decode error; nothing else.
"""

from __future__ import annotations

import sys

import atheris
import tomllib
from _harness import REPO, main  # the repository first on sys.path

with atheris.instrument_imports(include=["cuvil_edge"]):
    from cuvil_edge.errors import CuvilEdgeError
    from cuvil_edge.recipes import recipe_from_dict



def test_one_input(data: bytes) -> None:
    try:
        doc = tomllib.loads(data.decode("utf-8", "replace"))
    except tomllib.TOMLDecodeError:
        return
    try:
        recipe_from_dict(doc, "fuzz.toml", base=REPO / "recipes")
    except CuvilEdgeError:
        return


def seeds() -> list[bytes]:
    return [p.read_bytes() for p in sorted((REPO / "recipes").glob("*.toml"))]


if __name__ == "__main__":
    main(test_one_input, seeds)
    sys.exit(0)
