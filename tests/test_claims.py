"""Each page of the documentation names the evidence of its promises: a test, a `make` target or
a figure of `make bench`. Everything a page names must exist, so a page cannot point at a test
that was renamed or removed, and each docs page names at least one test.

A page names a test in two ways:

- in full, `tests/test_launch.py::test_timeout_names_the_stalled_ranks` (a parametrized id in
  brackets may follow), or a whole file, `tests/test_offline.py`;
- by its function alone, `test_timeout_names_the_stalled_ranks`, after its file was named
  earlier in the same paragraph (a list or a table is one): the name must be in that file.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()

# The pages read by a person: README.md, every docs page and the tutorials' list.
PAGES = ("README.md", *sorted(f"docs/{path.name}" for path in DOCS.glob("*.md")),
         "notebooks/README.md")
# The docs pages a person opens from the README; each names the tests of its promises.
READ_PAGES = ("launcher", "panels", "fine-tune", "memory", "speed", "pods", "tpu-only", "tasks",
              "doctor", "install", "torchtpu", "compile_cache", "libraries", "seq2seq",
              "architecture")

FULL = re.compile(r"tests/((?:\w+/)*\w+\.py)(?:::(\w+)(?:\[[^\]`]*\])?)?")
BARE = re.compile(r"(test_\w+)(?:\[[^\]`]*\])?")


def paragraphs(text: str) -> list[str]:
    """The page's paragraphs (a list or a table is one), without its code blocks."""
    return re.split(r"\n\s*\n", re.sub(r"(?ms)^```.*?^```", "", text))


def list_items(text: str) -> list[str]:
    """The items of the page's lists: an item runs to the next one (its lines are indented)."""
    return [item for paragraph in paragraphs(text)
            for item in re.split(r"\n(?=\s*(?:[-*]|\d+\.) )", paragraph)]


def named_tests(text: str) -> list[tuple[str, str | None, str]]:
    """Every test `text` names, as (file under tests/, function or None, how it was written)."""
    named = []
    for paragraph in paragraphs(text):
        current = None
        for token in re.findall(r"`([^`\n]+)`", paragraph):
            if full := FULL.fullmatch(token):
                current = full.group(1)
                named.append((current, full.group(2), token))
            elif bare := BARE.fullmatch(token):
                named.append((current, bare.group(1), token))
    return named


@functools.cache
def functions_of(path: str) -> set[str]:
    tree = ast.parse((ROOT / "tests" / path).read_text())
    return {node.name for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def named_make_targets(text: str) -> list[str]:
    """`make X` in backticks, and the `make X` lines of shell code blocks."""
    inline = re.findall(r"`make ([\w-]+)", text)
    code = "\n".join(re.findall(r"(?ms)^```(?:bash|sh|shell)\n(.*?)^```", text))
    return inline + re.findall(r"(?m)^make ([\w-]+)", code)


def named_bench_figures(text: str) -> list[int]:
    """Figure numbers in "`make bench` figure 10" or "`make bench` figures 2, 4 and 5"."""
    found = re.findall(r"`make bench` figures? ([\d, and]+)", text)
    return [int(number) for text in found for number in re.findall(r"\d+", text)]


def makefile_targets() -> set[str]:
    return set(re.findall(r"(?m)^([\w-]+):", (ROOT / "Makefile").read_text()))


def read(page: str) -> str:
    return (ROOT / page).read_text()


def test_the_reader_finds_tests_in_full_and_by_name_after_their_file():
    text = ("Refused (`tests/test_a.py::test_one[x]`, `test_two`).\n\n"
            "Tests, in `tests/pods/test_b.py`:\n- an item: `test_three`;\n- another: `test_four`"
            "\n\nAlone: `test_five`\n\n```python\n`tests/test_c.py::test_six`\n```\n")
    assert named_tests(text) == [
        ("test_a.py", "test_one", "tests/test_a.py::test_one[x]"),
        ("test_a.py", "test_two", "test_two"),
        ("pods/test_b.py", None, "tests/pods/test_b.py"),
        ("pods/test_b.py", "test_three", "test_three"),
        ("pods/test_b.py", "test_four", "test_four"),
        (None, "test_five", "test_five")]  # its paragraph names no file: an error below
    assert named_make_targets("`make demo TASK=x` and\n```bash\nmake bench  # all\n```\n") == [
        "demo", "bench"]
    assert named_bench_figures("`make bench` figures 2, 4 and 5; `make bench` figure 12") == [
        2, 4, 5, 12]


def test_every_test_a_page_names_exists():
    count = 0
    for page in PAGES:
        for path, function, written in named_tests(read(page)):
            assert path is not None, f"{page} names `{written}` without its file before it"
            assert (ROOT / "tests" / path).is_file(), f"{page} names tests/{path}: no such file"
            if function is not None:
                count += 1
                assert function in functions_of(path), \
                    f"{page} names `{written}`: tests/{path} has no {function}"
    assert count >= 400  # the pages name their tests (about 480 when this was written)


def test_each_docs_page_names_at_least_one_test():
    for name in READ_PAGES:
        page = f"docs/{name}.md"
        assert (ROOT / page).is_file(), f"{page} does not exist"
        assert named_tests(read(page)), f"{page} names no test"
    assert named_tests(README), "README.md names no test"


def test_every_make_target_and_bench_figure_a_page_names_exists():
    from bench.run import FIGURES

    targets = makefile_targets()
    makes = [(page, target) for page in PAGES for target in named_make_targets(read(page))]
    figures = [(page, n) for page in PAGES for n in named_bench_figures(read(page))]
    assert makes and figures  # the pages do name both kinds
    for page, target in makes:
        assert target in targets, f"{page} names `make {target}`: not in the Makefile"
    for page, number in figures:
        assert number in FIGURES, f"{page} names bench figure {number}: not in bench/run.py"
    for page in PAGES:
        for path in re.findall(r"`(bench/\w+\.py)", read(page)):
            assert (ROOT / path).is_file(), f"{page} names {path}, which does not exist"


def test_every_bold_guarantee_of_the_launcher_names_its_tests():
    """docs/launcher.md's guarantees are bold list items ("- **Failure.** ..."): each names
    the tests that hold it, in its own item."""
    items = [item for item in list_items(read("docs/launcher.md"))
             if re.match(r"\s*- \*\*[\w-]", item)]
    assert len(items) >= 5
    for item in items:
        assert [name for _, name, _ in named_tests(item) if name], f"names no test: {item[:60]}"


def test_the_bench_figures_the_speed_page_numbers_are_the_runners():
    """docs/speed.md says the figures are numbered 1 to N and lists each: bench/run.py has
    exactly those."""
    from bench.run import FIGURES

    speed = read("docs/speed.md")
    (last,) = re.findall(r"figures are numbered 1 to (\d+)", speed)
    assert sorted(FIGURES) == list(range(1, int(last) + 1))
    listed = [int(n) for n in re.findall(r"^\| (\d+) ", speed, flags=re.MULTILINE)]
    assert listed == sorted(FIGURES), listed


def test_the_readme_names_every_tutorial_the_tutorials_list_holds():
    """README.md links every notebook, and notebooks/README.md's table does too."""
    notebooks = {path.name for path in (ROOT / "notebooks").glob("*.ipynb")}
    listed = set(re.findall(r"\]\((\d\d_\w+\.ipynb)\)", read("notebooks/README.md")))
    assert listed == notebooks
    tutorials = README.split("## Tutorials", 1)[1].split("\n## ", 1)[0]
    linked = set(re.findall(r"\]\(notebooks/(\d\d_\w+\.ipynb)\)", tutorials))
    assert linked == notebooks


def test_the_readme_links_every_docs_page():
    """The README is the door: each page a person reads is linked from it, or from a page it
    links (seq2seq.md and compile_cache.md are reached from fine-tune.md and speed.md)."""
    links = set(re.findall(r"\]\((docs/[\w.-]+\.md)\)", README))
    reached = {f"docs/{target}" for link in links
               for target in re.findall(r"\]\(([\w.-]+\.md)\)", read(link))}
    for name in READ_PAGES:
        assert f"docs/{name}.md" in links | reached, f"README.md does not lead to {name}.md"
