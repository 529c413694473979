"""docs/architecture.md is the one map of the package: its "The map" section names every module
file under hfxla_nb/ (by its path relative to hfxla_nb/), once, each in a feature's row, and
every module it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hfxla_nb"
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def map_rows() -> list[tuple[str, list[str]]]:
    """The map's rows as (feature, the module paths it names): the table rows of the
    "## The map" section; a module is a backticked `path.py`."""
    section = ARCHITECTURE.read_text().split("\n## The map\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for feature, modules in re.findall(r"^\| (.+?) \| (.+) \|$", section, flags=re.MULTILINE):
        if feature != "feature" and not set(feature) <= {"-"}:
            rows.append((feature, re.findall(r"`([\w./]+\.py)`", modules)))
    return rows


def named_modules() -> list[str]:
    return [path for _, paths in map_rows() for path in paths]


def module_files() -> set[str]:
    return {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
            if "__pycache__" not in path.parts}


def test_every_module_file_is_on_the_map():
    missing = sorted(module_files() - set(named_modules()))
    assert not missing, f"modules missing from docs/architecture.md's map: {missing}"


def test_every_module_on_the_map_exists():
    gone = sorted(set(named_modules()) - module_files())
    assert not gone, f"docs/architecture.md's map names modules that do not exist: {gone}"


def test_each_module_is_on_the_map_once_in_a_features_row():
    paths = named_modules()
    twice = sorted({path for path in paths if paths.count(path) > 1})
    assert not twice, f"on the map more than once: {twice}"
    empty = [feature for feature, modules in map_rows() if not modules]
    assert not empty, f"features of the map without a module: {empty}"
    assert len(map_rows()) >= 10


def test_the_map_names_no_design_document_outside_the_repository():
    text = ARCHITECTURE.read_text()
    assert "DESIGN.md" not in text or (ROOT / "DESIGN.md").is_file()
