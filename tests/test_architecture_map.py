"""docs/architecture.md is the one map of the package: every module file under hfxla_nb/ is on
it (by its path relative to hfxla_nb/), once, and every module on it exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hfxla_nb"
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def map_rows() -> list[tuple[str, str]]:
    """The map's rows as (path relative to hfxla_nb/, what it holds): the table rows of the
    "## The map" section whose first cell is a `path.py`."""
    section = ARCHITECTURE.read_text().split("\n## The map\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([\w./]+\.py)` \| (.*?) \|$", section, flags=re.MULTILINE)


def module_files() -> set[str]:
    return {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
            if "__pycache__" not in path.parts}


def test_every_module_file_is_on_the_map():
    on_map = {path for path, _ in map_rows()}
    missing = sorted(module_files() - on_map)
    assert not missing, f"modules missing from docs/architecture.md's map: {missing}"


def test_every_module_on_the_map_exists():
    gone = sorted({path for path, _ in map_rows()} - module_files())
    assert not gone, f"docs/architecture.md's map lists modules that do not exist: {gone}"


def test_each_module_is_on_the_map_once_with_what_it_holds():
    paths = [path for path, _ in map_rows()]
    twice = sorted({path for path in paths if paths.count(path) > 1})
    assert not twice, f"on the map more than once: {twice}"
    empty = [path for path, holds in map_rows() if not holds.strip() or holds.strip() == "TODO"]
    assert not empty, f"on the map without what they hold: {empty}"


def test_the_map_names_no_design_document_outside_the_repository():
    text = ARCHITECTURE.read_text()
    assert "DESIGN.md" not in text or (ROOT / "DESIGN.md").is_file()
