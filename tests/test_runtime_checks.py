"""`python -O` strips `assert`: the code that runs in production checks its
runtime conditions with real errors instead (what `-O` runs is tested by
tests/test_streams.py::test_cli_replay_to_print)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Generated protobuf code aside.
CHECKED = sorted(p for folder in ("kpng_py", "backends/userspace")
                 for p in (REPO / folder).rglob("*.py") if "api" not in p.relative_to(REPO).parts)


def test_no_assert_guards_a_runtime_condition() -> None:
    asserts = [f"{path.relative_to(REPO)}:{node.lineno}" for path in CHECKED
               for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Assert)]
    assert asserts == [], ("raise an error that names the object and the fix, or make the "
                           "condition impossible by construction")
