"""docs/claims.md maps each promise of the documentation to the evidence that fails without it:
a test, a `make` target, or a figure of `make bench`. It has one section per page (README.md
and the docs pages). Everything it names must exist, every row must name some evidence, every
page must have a section, and the promises that can be found by their form (the `make`
commands, the launcher's bold guarantees) must have a row."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CLAIMS = DOCS / "claims.md"
README = (ROOT / "README.md").read_text()

# The pages whose promises claims.md holds to account, relative to the repository's root.
PAGES = ("README.md", "docs/launcher.md", "docs/panels.md", "docs/fine-tune.md",
         "docs/memory.md", "docs/speed.md", "docs/pods.md", "docs/tpu-only.md", "docs/tasks.md",
         "docs/doctor.md", "docs/torchtpu.md", "docs/install.md")
# `make lab` opens JupyterLab, `make lint` runs the contracts, `make setup` builds .venv:
# commands, not promises.
NOT_PROMISES = {"lab", "lint", "setup"}


def claim_rows() -> list[tuple[str, str, str]]:
    """The rows of every section's table as (page, promise, evidence). A section's page is the
    link in its `## ` heading, relative to the repository's root."""
    rows, page = [], ""
    for line in CLAIMS.read_text().splitlines():
        if line.startswith("## "):
            (link,) = re.findall(r"\]\(([\w./-]+\.md)\)", line)
            page = (DOCS / link).resolve().relative_to(ROOT).as_posix()
            continue
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 2 and cells[0] != "promise" and not set(cells[0]) <= {"-"}:
            assert page, f"a row before the first section: {line}"
            rows.append((page, cells[0], cells[1]))
    return rows


def named_tests(evidence: str) -> list[tuple[str, str]]:
    return re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", evidence)


def named_make_targets(evidence: str) -> list[str]:
    return re.findall(r"`make ([\w-]+)", evidence)


def named_bench_figures(evidence: str) -> list[int]:
    """Figure numbers in "`make bench` figure 10" or "figures 2, 4" (after `make bench`)."""
    found = re.findall(r"`make bench` figures? ([\d, and]+)", evidence)
    return [int(number) for text in found for number in re.findall(r"\d+", text)]


def makefile_targets() -> set[str]:
    makefile = (ROOT / "Makefile").read_text()
    return set(re.findall(r"(?m)^([\w-]+):", makefile))


def promises_of(page: str) -> str:
    """The promises of `page`'s section, lower-cased, as one text."""
    return " ".join(promise.lower() for where, promise, _ in claim_rows() if where == page)


def test_every_page_has_a_section_and_every_section_is_a_page():
    pages = {page for page, _, _ in claim_rows()}
    assert pages <= {*PAGES, "docs/architecture.md"}, pages - set(PAGES)
    for page in PAGES:
        assert (ROOT / page).is_file(), f"{page} does not exist"
        assert page in pages, f"docs/claims.md has no section for {page}"


def test_every_test_the_claims_table_names_exists():
    names = [name for _, _, evidence in claim_rows() for name in named_tests(evidence)]
    assert len(names) >= 40
    for path, name in names:
        assert (ROOT / path).is_file(), f"docs/claims.md names {path}, which does not exist"
        tree = ast.parse((ROOT / path).read_text())
        functions = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
        assert name in functions, f"docs/claims.md names {path}::{name}, which does not exist"


def test_every_make_target_and_bench_figure_it_names_exists():
    from bench.run import FIGURES

    targets = makefile_targets()
    figures = [n for _, _, evidence in claim_rows() for n in named_bench_figures(evidence)]
    makes = [t for _, _, evidence in claim_rows() for t in named_make_targets(evidence)]
    assert figures and makes  # the table does name both kinds
    for target in makes:
        assert target in targets, f"docs/claims.md names `make {target}`: not in the Makefile"
    for number in figures:
        assert number in FIGURES, f"docs/claims.md names bench figure {number}: not in bench/run.py"
    for path in re.findall(r"`(bench/\w+\.py)", CLAIMS.read_text()):
        assert (ROOT / path).is_file(), f"docs/claims.md names {path}, which does not exist"


def test_every_row_names_evidence():
    for page, promise, evidence in claim_rows():
        assert named_tests(evidence) or named_make_targets(evidence) or \
            named_bench_figures(evidence), f"{page}: {promise!r} names no test, target or figure"


def test_every_make_command_of_the_pages_has_a_row():
    """Each `make` command that README.md, a docs page or the tutorials' list offers has a row
    (in any section: `make demo` is on several pages)."""
    promises = " ".join(promise.lower() for _, promise, _ in claim_rows())
    sources = [*PAGES, "notebooks/README.md"]
    for source in sources:
        offered = set(re.findall(r"`make ([\w-]+)", (ROOT / source).read_text()))
        for target in offered - NOT_PROMISES:
            assert f"make {target}" in promises, f"{source} offers `make {target}`: no row"


def test_every_bold_guarantee_of_the_launcher_has_a_row_in_its_section():
    """docs/launcher.md's guarantees are bold list items ("- **Failure.** ..."): each has a row
    of the launcher's section whose promise starts with its first word."""
    text = (DOCS / "launcher.md").read_text()
    guarantees = re.findall(r"^- \*\*([\w-]+)", text, flags=re.MULTILINE)
    assert len(guarantees) >= 5
    promises = promises_of("docs/launcher.md")
    for word in guarantees:
        assert word.lower() in promises, f"docs/launcher.md's **{word}...** has no row"


def test_the_bench_figures_the_speed_page_numbers_are_the_runners():
    """docs/speed.md says the figures are numbered 1 to N and lists each: bench/run.py has
    exactly those."""
    from bench.run import FIGURES

    speed = (DOCS / "speed.md").read_text()
    (last,) = re.findall(r"figures are numbered 1 to (\d+)", speed)
    assert sorted(FIGURES) == list(range(1, int(last) + 1))
    listed = [int(n) for n in re.findall(r"^\| (\d+) ", speed, flags=re.MULTILINE)]
    assert listed == sorted(FIGURES), listed


def test_the_readme_names_every_tutorial_the_tutorials_list_holds():
    """README.md links every notebook, and notebooks/README.md's table does too."""
    notebooks = {path.name for path in (ROOT / "notebooks").glob("*.ipynb")}
    listed = set(re.findall(r"\]\((\d\d_\w+\.ipynb)\)", (ROOT / "notebooks/README.md").read_text()))
    assert listed == notebooks
    tutorials = README.split("## Tutorials", 1)[1].split("\n## ", 1)[0]
    linked = set(re.findall(r"\]\(notebooks/(\d\d_\w+\.ipynb)\)", tutorials))
    assert linked == notebooks


def test_the_readme_links_every_docs_page():
    """The README is the door: each page of PAGES (and the map) is linked from it."""
    links = set(re.findall(r"\]\((docs/[\w.-]+\.md)\)", README))
    for page in [*PAGES[1:], "docs/architecture.md", "docs/claims.md"]:
        assert page in links, f"README.md does not link {page}"
