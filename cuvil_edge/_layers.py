"""The package's layers as data, the import rule they imply, and the dependency picture.

cuvil-edge is read from the top: the commands a user runs, then the load generator (a client of the
daemon), then the three jobs (packager on the host, deploy between host and board, the daemon on the
board), then what the board runs with (runtime, telemetry), then the contracts and inputs they share
(bundle, recipes, models), then the platform (board profiles, C kernels, TensorRT plugins), then the
foundation (errors, atomic writes, consoles). A module may import a layer below its own, never one
above; modules of one layer do not import each other (foundation excepted), so the daemon imports
neither the packager nor deploy and a board's daemon loads nothing of the host's tools.

A second rule holds across every module, whatever its layer: no module imports a private name
(``_name``) of another module; a package may import its own private submodules (``_python.py``), and
private top-level modules of the foundation (``_console``) are the house's shared helpers.

The rules are checked on the source with :mod:`ast` (no import runs), so a planted upward import fails
the test suite, and the same scan draws the Mermaid picture in ``docs/architecture.md``::

    python -m cuvil_edge._layers --check            # exit 1 on a forbidden import
    python -m cuvil_edge._layers --write docs/architecture.md   # redraw the picture
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ALLOWED_UPWARD",
    "LAYERS",
    "Edge",
    "Layer",
    "import_cycles",
    "import_edges",
    "layer_of",
    "main",
    "mermaid",
    "private_imports",
    "replace_picture",
    "violations",
]

PACKAGE = "cuvil_edge"


@dataclass(frozen=True)
class Layer:
    """One layer: its name, the units in it (subpackages or top-level modules), and what it is for."""

    name: str
    units: tuple[str, ...]
    why: str
    sideways: bool = False  # may units of this layer import each other?


# Top to bottom. A unit is a subpackage (``daemon``) or a top-level module (``targets``); the
# package's own ``__init__`` is the unit ``cuvil_edge``.
LAYERS: tuple[Layer, ...] = (
    Layer("entry", ("cli", "demo"),
          "commands a user runs; each is a thin call into a module below"),
    Layer("client", ("loadgen", "top"),
          "clients of the daemon: a KServe load generator that starts the daemon as a process and "
          "measures it (tritonclient), and top, a live view of running daemons"),
    Layer("jobs", ("packager", "deploy", "daemon"),
          "the host's packager, deploy between host and boards, the board's daemon; independent of "
          "each other, so a board install carries none of the host's tools"),
    Layer("device", ("runtime", "telemetry"),
          "what the daemon runs with on a board: inference backends, memory and power telemetry"),
    Layer("contracts", ("bundle", "recipes", "models"),
          "what host and board agree on: the bundle format, recipes, the built-in models"),
    Layer("platform", ("targets", "sve", "trt_plugins"),
          "board profiles, the C kernels and TensorRT plugins"),
    Layer("foundation", ("errors", "_atomic", "_toml", "_progress", "_console", "_cache", "_layers", "_device_options",
                         "_optional",
                         "_test_hooks",
                         "_prometheus",
                         PACKAGE),
          "the error tree, atomic writes, TOML, consoles and progress, the host cache directory", sideways=True),
)

# Known upward imports, each with the reason it is tolerated. The test fails on any import that
# is neither downward nor listed here, and on an entry that no longer matches an import, so this
# list only shrinks. Keys are (importing module, imported unit).
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Edge:
    """One import statement between two units."""

    source: str        # importing module, dotted (cuvil_edge.runtime.trt)
    target: str        # imported module, dotted (cuvil_edge.packager.inspect)
    path: Path         # file of the importing module
    line: int

    @property
    def source_unit(self) -> str:
        return unit_of(self.source)

    @property
    def target_unit(self) -> str:
        return unit_of(self.target)

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.source} imports {self.target}"


def unit_of(module: str) -> str:
    """The unit a dotted module name belongs to: ``cuvil_edge.daemon.kserve`` -> ``daemon``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer_of(unit: str) -> int | None:
    """Index of the layer holding ``unit`` (0 is the top), None for a unit no layer names."""
    for index, layer in enumerate(LAYERS):
        if unit in layer.units:
            return index
    return None


def _module_name(root: Path, path: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _exists(root: Path, dotted: str) -> bool:
    rel = Path(*dotted.split(".")[1:]) if "." in dotted else Path()
    return (root / rel).with_suffix(".py").is_file() or (root / rel / "__init__.py").is_file()


def _targets(root: Path, module: str, is_package: bool, node: ast.AST) -> Iterable[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            name = ".".join(base + ([node.module] if node.module else []))
        else:
            name = node.module or ""
        for alias in node.names:
            # ``from cuvil_edge import sve`` imports the subpackage, not the package's __init__.
            sub = f"{name}.{alias.name}"
            yield sub if name.startswith(PACKAGE) and _exists(root, sub) else name
    elif isinstance(node, ast.Call):
        # importlib.import_module("cuvil_edge.x") with a literal name is an import too.
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if called == "import_module" and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            yield node.args[0].value


def import_edges(root: Path) -> list[Edge]:
    """Every import from one unit of the package at ``root`` into another, in file order.

    Args:
        root (Path): the package directory (``.../cuvil_edge``).
    """
    root = Path(root)
    edges: list[Edge] = []
    for path in sorted(root.rglob("*.py")):
        module = _module_name(root, path)
        tree = ast.parse(path.read_text("utf-8"), filename=str(path))
        for node in ast.walk(tree):
            for target in _targets(root, module, path.name == "__init__.py", node):
                if target == PACKAGE or target.startswith(PACKAGE + "."):
                    if unit_of(target) != unit_of(module):
                        edges.append(Edge(module, target, path, getattr(node, "lineno", 0)))
    return sorted(edges, key=lambda e: (str(e.path), e.line, e.target))


def private_imports(root: Path) -> list[str]:
    """One message per ``from M import _name`` where ``_name`` is a private name of another module.

    Importing a submodule (``from cuvil_edge.trt_plugins import _python``) is not one: a package owns
    its private modules. A private name is a module's own business; a caller that needs it needs a
    public name.

    Args:
        root (Path): the package directory (``.../cuvil_edge``).
    """
    root = Path(root)
    problems = []
    for path in sorted(root.rglob("*.py")):
        module = _module_name(root, path)
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text("utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not (source == PACKAGE or source.startswith(PACKAGE + ".")) or source == module:
                continue
            for alias in node.names:
                name = alias.name
                if name.startswith("_") and not name.startswith("__") and not _exists(root, f"{source}.{name}"):
                    problems.append(f"{path}:{node.lineno}: {module} imports the private name {name} of {source}; "
                                    "make it public (and list it in __all__) or keep the caller out")
    return problems


def import_cycles(root: Path) -> list[list[str]]:
    """Groups of modules that import each other, directly or around a loop, lazy imports included.

    The layer rule keeps units acyclic; this finds loops inside one unit (``deploy.cli`` and
    ``deploy.engines_cli`` importing each other). A package's imports of its own submodules are left
    out: a package loading its children (``trt_plugins`` registering ``_python``) is how packages work.

    Args:
        root (Path): the package directory (``.../cuvil_edge``).

    Returns:
        list[list[str]]: each cycle's modules, sorted; empty when there is none.
    """
    root = Path(root)
    graph: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        module = _module_name(root, path)
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text("utf-8"), filename=str(path))
        targets = graph.setdefault(module, set())
        for node in ast.walk(tree):
            for target in _targets(root, module, is_package, node):
                if not (target == PACKAGE or target.startswith(PACKAGE + ".")):
                    continue
                while "." in target and not _exists(root, target):
                    target = target.rsplit(".", 1)[0]  # from M import name: the module M
                if target != module and not (is_package and target.startswith(module + ".")):
                    targets.add(target)
    # Tarjan's strongly connected components, iteratively (no recursion limit on a deep package).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return sorted(cycles)


def violations(edges: Sequence[Edge], allowed: dict[tuple[str, str], str] | None = None) -> list[str]:
    """One message per import that breaks the layer rule and is not on the allow-list.

    Args:
        edges (Sequence[Edge]): from :func:`import_edges`.
        allowed (dict | None): upward imports to tolerate. Defaults to :data:`ALLOWED_UPWARD`.
    """
    allowed = ALLOWED_UPWARD if allowed is None else allowed
    problems = []
    for edge in edges:
        src, dst = layer_of(edge.source_unit), layer_of(edge.target_unit)
        if src is None or dst is None:
            unit = edge.source_unit if src is None else edge.target_unit
            problems.append(f"{edge}: unit '{unit}' is in no layer; add it to LAYERS in cuvil_edge/_layers.py")
            continue
        if dst > src or (dst == src and LAYERS[src].sideways):
            continue
        if (edge.source, edge.target_unit) in allowed:
            continue
        where = "above" if dst < src else "beside"
        problems.append(f"{edge}: layer '{LAYERS[src].name}' must not import '{edge.target_unit}' "
                        f"(layer '{LAYERS[dst].name}', {where} it)")
    return problems


def stale_allowances(edges: Sequence[Edge], allowed: dict[tuple[str, str], str] | None = None) -> list[str]:
    """Allow-list entries no import uses any more: remove them so the list only shrinks."""
    allowed = ALLOWED_UPWARD if allowed is None else allowed
    used = {(e.source, e.target_unit) for e in edges}
    return [f"{src} -> {dst}" for src, dst in allowed if (src, dst) not in used]


def mermaid(edges: Sequence[Edge]) -> str:
    """The unit-level dependency picture as a Mermaid flowchart, one subgraph per layer.

    Allowed upward imports are dotted arrows. The text depends only on which units import which,
    so it changes when the structure does, not when one more import joins an existing arrow.
    """
    lines = ["flowchart TB"]
    present = {e.source_unit for e in edges} | {e.target_unit for e in edges}
    for layer in LAYERS:
        units = [u for u in layer.units if u in present]
        if not units:
            continue
        lines.append(f"  subgraph {layer.name}")
        lines.extend(f"    {_node(u)}[\"{_label(u)}\"]" for u in units)
        lines.append("  end")
    pairs: dict[tuple[str, str], bool] = {}
    for e in edges:
        src, dst = layer_of(e.source_unit), layer_of(e.target_unit)
        upward = src is not None and dst is not None and dst <= src and not (dst == src and LAYERS[src].sideways)
        key = (e.source_unit, e.target_unit)
        pairs[key] = pairs.get(key, False) or upward
    for (src, dst), upward in sorted(pairs.items()):
        if dst in ("errors", PACKAGE):
            continue  # everything raises from the error tree; drawing it hides the picture
        arrow = "-. allowed .->" if upward else "-->"
        lines.append(f"  {_node(src)} {arrow} {_node(dst)}")
    return "\n".join(lines) + "\n"


def _node(unit: str) -> str:
    return "pkg" if unit == PACKAGE else unit.strip("_")


def _label(unit: str) -> str:
    return "cuvil_edge/__init__" if unit == PACKAGE else unit


BEGIN = "<!-- BEGIN generated dependency picture: python -m cuvil_edge._layers --write docs/architecture.md -->"
END = "<!-- END generated dependency picture -->"


def replace_picture(text: str, picture: str) -> str:
    """``text`` with the block between :data:`BEGIN` and :data:`END` replaced by ``picture``."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the page lacks the markers {BEGIN!r} ... {END!r}")
    return text[: start + len(BEGIN)] + "\n```mermaid\n" + picture + "```\n" + text[end:]


def main(argv: Sequence[str] | None = None) -> int:
    """Check the import rule, or redraw the picture in a Markdown page (``--write PAGE``)."""
    parser = argparse.ArgumentParser(prog="python -m cuvil_edge._layers", description=main.__doc__)
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent,
                        help="package directory to scan (default: this cuvil_edge)")
    parser.add_argument("--check", action="store_true", help="exit 1 if an import breaks the layer rule")
    parser.add_argument("--write", type=Path, metavar="PAGE", help="redraw the picture in PAGE")
    parser.add_argument("--print", action="store_true", help="print the Mermaid picture")
    args = parser.parse_args(argv)
    edges = import_edges(args.root)
    rc = 0
    if args.check or not (args.write or args.print):
        problems = violations(edges) + [f"stale allow-list entry: {s}" for s in stale_allowances(edges)]
        problems += private_imports(args.root)
        problems += [f"import cycle: {' -> '.join(cycle)}" for cycle in import_cycles(args.root)]
        for problem in problems:
            print(problem, file=sys.stderr)
        print(f"{'FAILED' if problems else 'PASSED'}: {len(edges)} imports between units, "
              f"{len(problems)} against the rules", file=sys.stderr)
        rc = 1 if problems else 0
    if args.print:
        sys.stdout.write(mermaid(edges))
    if args.write:
        page = args.write.read_text("utf-8")
        new = replace_picture(page, mermaid(edges))
        if new != page:
            args.write.write_text(new, "utf-8")
    return rc


if __name__ == "__main__":
    sys.exit(main())
