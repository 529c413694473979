"""The package's comments, docstrings and messages say why in the code's own terms: none cites
this project's private history ("issue 18", "#28 item 9", "stop 36", "round 4", "bench figure
12"), which a newcomer cannot look up. Public upstream issues stay citable by their project:
pytorch/xla#5005, huggingface/transformers#29659, "transformers #18661"."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hfxla_nb"

#: Words that number a step of this project's history.
HISTORY = re.compile(r"\b(?:stop|item|issue|round|figure)s? \d+|\bbench figure", re.IGNORECASE)
#: A bare issue number: `#28`, not a colour (`#1f77b4`) or an HTML entity (`&#8203;`).
NUMBER = re.compile(r"(?<![\w/&])#\d+\b")
#: What may stand before an issue number: a public project, `owner/repo` or a known name.
UPSTREAM = re.compile(r"(?:[\w.-]+/[\w.-]+|transformers|accelerate|peft|trl|datasets|torch|"
                      r"torch_xla|jax|tensorflow) ?$")


def private_references(text: str) -> list[str]:
    """The lines of `text` that cite private history."""
    found = []
    for line in text.splitlines():
        if HISTORY.search(line) or any(not UPSTREAM.search(line[:match.start()])
                                       for match in NUMBER.finditer(line)):
            found.append(line.strip())
    return found


def test_the_check_finds_private_references_and_keeps_upstream_ones():
    assert private_references("x = 1  # the CI flake of stop 36") != []
    assert private_references('"""Counted so (#28, item 12)."""') != []
    assert private_references("# see issue 18") != []
    assert private_references("(about 0.1 s: bench figure 7)") != []
    assert private_references("fixed in round 4") != []
    assert private_references("a lock held forever (#29).") != []
    upstream = ("hangs upstream (pytorch/xla#5005, pytorch/xla#9089)",
                "(pytorch/xla #7169)", "(transformers #18661)", "LargeWorldModel/LWM #60",
                'BLUE = "#1f77b4"', "round(x, 2)", "the first item", "&#8203;")
    assert [line for line in upstream if private_references(line)] == []


def test_no_private_history_in_the_package():
    found = {f"{path.relative_to(PACKAGE.parent)}: {line}"
             for path in sorted(PACKAGE.rglob("*.py"))
             for line in private_references(path.read_text(encoding="utf-8"))}
    assert not found, ("Say why in the code's own terms (a public upstream issue may be cited "
                       "as owner/repo#N):\n" + "\n".join(sorted(found)))


def test_no_private_history_in_the_test_modules_headers():
    """A test module's header says what it checks, not which of our issues asked for it (the
    bench's own figures, public in bench/RESULTS.md, may be named)."""
    import ast

    cited = re.compile(r"\b(?:issue|item|stop|round)s? \d+|(?<![\w/&])#\d+\b", re.IGNORECASE)
    found = [str(path.relative_to(PACKAGE.parent))
             for path in sorted((PACKAGE.parent / "tests").rglob("test_*.py"))
             if path.name != "test_code_words.py"
             and cited.search(ast.get_docstring(ast.parse(path.read_text("utf-8"))) or "")]
    assert found == []
