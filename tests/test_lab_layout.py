"""The lab's place in the tree: the e2e harness (hack/e2e), the bench and
the tests share lab/, none of them borrows another's helpers, the product
(kpng_py/, backends/) imports none of them, and nothing needs PYTHONPATH or
a sys.path edit to import them (docs/architecture.md, "Where each concern
lives")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Top-level packages each part of the lab must not import.
LAB_PARTS = {
    "lab": {"e2e", "bench", "tests"},
    "hack/e2e": {"bench", "tests"},
    "bench": {"e2e", "tests"},
    "tests": {"e2e"},
}
# The product imports none of the lab's parts (lab.backends keeps what a lab
# run knows of the product's backends).
_LAB = {"lab", "e2e", "bench", "tests"}
FORBIDDEN = {**LAB_PARTS, "kpng_py": _LAB, "backends": _LAB}
# What starts a Python process or test run of the project.
LAUNCHERS = ["Makefile", "pyproject.toml", *(p.relative_to(ROOT).as_posix()
                                             for p in (ROOT / "hack").glob("*.sh"))]


def _imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}
    names |= {node.module for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    return {name.split(".")[0] for name in names}


def _sources(part: str) -> list[Path]:
    return sorted((ROOT / part).rglob("*.py"))


@pytest.mark.parametrize("part", sorted(FORBIDDEN))
def test_no_part_imports_another(part):
    borrowed = {str(path.relative_to(ROOT)): sorted(_imported_packages(path) & FORBIDDEN[part])
                for path in _sources(part)}
    assert _sources(part), f"{part} has no Python files: is the layout still as described?"
    assert {path: names for path, names in borrowed.items() if names} == {}


def test_nothing_edits_the_import_path():
    edits = [str(path.relative_to(ROOT)) for part in LAB_PARTS for path in _sources(part)
             if path != Path(__file__).resolve() and _edits_sys_path(path)]
    assert edits == []


def _edits_sys_path(path: Path) -> bool:
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr == "path"
                and isinstance(node.value, ast.Name) and node.value.id == "sys"):
            return True
        if isinstance(node, ast.Constant) and node.value == "PYTHONPATH":
            return True
    return False


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_launchers_set_no_pythonpath(launcher):
    text = (ROOT / launcher).read_text()
    assert "PYTHONPATH" not in text
    assert "pythonpath" not in text  # pytest's ini option
