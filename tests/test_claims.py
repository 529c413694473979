"""docs/claims.md maps each README promise to the evidence that fails without it: a test, a
`make` target, or a figure of `make bench`. Everything it names must exist, every row must name
some evidence, and the README's promises it can find by their form must have a row."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def claim_rows() -> list[tuple[str, str]]:
    """The table's rows as (claim, evidence) cells (the header and its rule left out)."""
    rows = []
    for line in (ROOT / "docs/claims.md").read_text().splitlines():
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 2 and cells[0] != "README claim" and not set(cells[0]) <= {"-"}:
            rows.append((cells[0], cells[1]))
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


def test_every_test_the_claims_table_names_exists():
    names = [name for _, evidence in claim_rows() for name in named_tests(evidence)]
    assert len(names) >= 40
    for path, name in names:
        tree = ast.parse((ROOT / path).read_text())
        functions = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
        assert name in functions, f"docs/claims.md names {path}::{name}, which does not exist"


def test_every_make_target_and_bench_figure_it_names_exists():
    from bench.run import FIGURES

    targets = makefile_targets()
    figures = [n for _, evidence in claim_rows() for n in named_bench_figures(evidence)]
    makes = [t for _, evidence in claim_rows() for t in named_make_targets(evidence)]
    assert figures and makes  # the table does name both kinds
    for target in makes:
        assert target in targets, f"docs/claims.md names `make {target}`: not in the Makefile"
    for number in figures:
        assert number in FIGURES, f"docs/claims.md names bench figure {number}: not in bench/run.py"
    for path in re.findall(r"`(bench/\w+\.py)", (ROOT / "docs/claims.md").read_text()):
        assert (ROOT / path).is_file(), f"docs/claims.md names {path}, which does not exist"


def test_every_row_names_evidence():
    for claim, evidence in claim_rows():
        assert named_tests(evidence) or named_make_targets(evidence) or \
            named_bench_figures(evidence), f"the claim {claim!r} names no test, target or figure"


def test_the_readme_promises_found_by_their_form_have_rows():
    """What can be found mechanically: each `make` command the README offers, and each bold
    guarantee of the launcher ("**Failure.**"), has a row whose claim names it."""
    claims = " ".join(claim.lower() for claim, _ in claim_rows())
    for target in set(re.findall(r"`make ([\w-]+)", README)) - {"lab", "lint"}:
        # `make lab` opens JupyterLab, `make lint` is the contracts' runner: no promise.
        assert f"make {target}" in claims, f"README offers `make {target}`: no row of claims.md"
    guarantees = re.findall(r"^- \*\*([\w-]+)", README, flags=re.MULTILINE)
    assert len(guarantees) >= 5
    for word in guarantees:
        assert word.lower() in claims, f"README's **{word}...** guarantee has no row in claims.md"


def test_the_bench_figures_the_readme_numbers_are_the_runners():
    """README says the figures are numbered 1 to N: bench/run.py has exactly those."""
    from bench.run import FIGURES

    (last,) = re.findall(r"figures are numbered 1 to (\d+)", README)
    assert sorted(FIGURES) == list(range(1, int(last) + 1))


def test_the_readme_names_every_tutorial_the_tutorials_list_holds():
    """README lists the tutorials' topics without a count that drifts; notebooks/README.md's
    table links every notebook there is."""
    listed = set(re.findall(r"\]\((\d\d_\w+\.ipynb)\)", (ROOT / "notebooks/README.md").read_text()))
    assert listed == {path.name for path in (ROOT / "notebooks").glob("*.ipynb")}
    tutorials = README.split("## Tutorials", 1)[1].split("##", 1)[0]
    assert not re.search(r"\b(one|two|three|four|five|six|seven|eight|nine|ten) "
                         r"step-through tutorials", tutorials)
