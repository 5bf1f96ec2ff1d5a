"""The repository explains itself: nothing in it points at files a clone does not have."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("README.md", "cuvil_edge", "docs", "tests", "bench", "hil", "scripts")
# Notes of the team that wrote the code, kept outside the repository. Spelled in pieces so this
# file does not match itself.
OUTSIDE = ("shared" + "/", "PEERS" + ".md", "DESIGN" + ".md", "CONTRACTS" + ".md")
# Pages other branches of issue #14 add; drop a name once its page is in the tree.
PENDING_PAGES: set[str] = set()


def _text_files(root: Path) -> list[Path]:
    files = []
    for top in SCANNED:
        path = root / top
        if not path.exists():
            continue
        candidates = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for p in candidates:
            if "__pycache__" in p.parts or p.suffix in (".so", ".pyc", ".npz", ".onnx", ".png", ".cvb"):
                continue
            try:
                p.read_text("utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            files.append(p)
    return files


def _outside_references(root: Path) -> list[str]:
    hits = []
    for path in _text_files(root):
        for number, line in enumerate(path.read_text("utf-8").splitlines(), 1):
            for word in OUTSIDE:
                if word in line:
                    hits.append(f"{path.relative_to(root)}:{number}: {word}")
    return hits


def test_no_file_refers_to_notes_outside_the_repo():
    assert len(_text_files(REPO)) > 100  # the scan reads the real tree
    hits = _outside_references(REPO)
    assert hits == [], "replace with a self-contained explanation or a docs/ link:\n" + "\n".join(hits)


def test_the_scan_finds_a_planted_reference(tmp_path):
    (tmp_path / "cuvil_edge" / "daemon").mkdir(parents=True)
    (tmp_path / "cuvil_edge" / "daemon" / "x.py").write_text("# clean\n# layout: see " + OUTSIDE[3] + "\n")
    (tmp_path / "README.md").write_text("See `" + OUTSIDE[0] + OUTSIDE[2] + "`.\n")
    assert sorted(_outside_references(tmp_path)) == sorted([
        "README.md:1: " + OUTSIDE[0], "README.md:1: " + OUTSIDE[2], "cuvil_edge/daemon/x.py:2: " + OUTSIDE[3]])


_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("page", ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))])
def test_relative_links_in_docs_resolve(page):
    source = REPO / page
    broken = []
    for target in _LINK.findall(source.read_text("utf-8")):
        if "://" in target or target.startswith("mailto:"):
            continue
        resolved = (source.parent / target).resolve()
        rel = resolved.relative_to(REPO).as_posix() if resolved.is_relative_to(REPO) else str(resolved)
        if not resolved.exists() and rel not in PENDING_PAGES:
            broken.append(target)
    assert broken == [], f"{page} links to missing files: {broken}"


def test_readme_links_every_doc_page():
    readme = (REPO / "README.md").read_text("utf-8")
    for page in ("architecture", "bundle-format", "packager", "daemon", "deploy", "hil"):
        assert f"(docs/{page}.md)" in readme


def _command_names() -> set[str]:
    import typer.main

    from cuvil_edge.cli import app

    group = typer.main.get_command(app)
    return set(group.commands)  # type: ignore[attr-defined]


@pytest.mark.parametrize("page", ["cuvil_edge/daemon/units/cuvil-edged.service",
                                  "docs/architecture.md", "docs/bundle-format.md"])
def test_commands_named_in_shipped_text_exist(page):
    """A comment or page that tells the user to run `cuvil-edge X` names a real command."""
    named = set(re.findall(r"`cuvil-edge ([a-z][a-z-]*)", (REPO / page).read_text("utf-8")))
    assert named, f"{page} names no command; the test would prove nothing"
    assert sorted(named - _command_names()) == []


def test_the_unit_names_the_command_that_installs_it():
    unit = (REPO / "cuvil_edge/daemon/units/cuvil-edged.service").read_text("utf-8")
    assert "`cuvil-edge install-daemon" in unit and "deploy install" not in unit
    assert "install-daemon" in _command_names()
