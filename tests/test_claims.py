"""docs/claims.md maps each README promise to a test: every test it names must exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def named_tests() -> list[tuple[str, str]]:
    table = (ROOT / "docs/claims.md").read_text()
    return re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", table)


def test_every_test_the_claims_table_names_exists():
    names = named_tests()
    assert len(names) >= 40
    for path, name in names:
        tree = ast.parse((ROOT / path).read_text())
        functions = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
        assert name in functions, f"docs/claims.md names {path}::{name}, which does not exist"
