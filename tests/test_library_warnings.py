"""Warnings of libraries the user did not call: one muted line per kind in the cell, with its
count, every one kept on `hx.last_launch().warnings`; the user's own warnings as Python shows
them. The folding rule is driven directly; one real launch, in a Jupyter kernel, shows both.
"""

from __future__ import annotations

import sysconfig
import textwrap

import pytest

from hfxla_nb.events import LibraryWarning
from hfxla_nb.launch.output import STANDARD_LIBRARY, folded_lines, library_package
from tests.helpers import kernel_fixture, run_ok

SITE = "/venv/lib/python3.12/site-packages"
MESSAGE = "`is_gradient_checkpointing` is deprecated and will be removed in version 5"


def caught(package: str, message: str = MESSAGE, category: str = "FutureWarning",
           rank: int | None = 0) -> LibraryWarning:
    return LibraryWarning(rank=rank, category=category, message=message,
                          filename=f"{SITE}/{package}/modeling_utils.py", lineno=12,
                          package=package)


def test_a_location_in_a_library_names_its_package_and_the_users_code_none():
    assert library_package(f"{SITE}/transformers/modeling_utils.py") == "transformers"
    assert library_package("/usr/lib/python3/dist-packages/torch/nn/modules/module.py") == "torch"
    assert library_package(f"{SITE}/six.py") == "six"
    stdlib = sysconfig.get_paths()["stdlib"]
    assert library_package(f"{stdlib}/importlib/__init__.py") == STANDARD_LIBRARY
    # A notebook cell, a user's file, a file merely named like a library: the user's.
    assert library_package("/tmp/ipykernel_123/2913491.py") is None
    assert library_package("/home/me/project/train.py") is None
    assert library_package("/home/me/site-packages-notes/train.py") is None


def test_library_warnings_fold_into_one_line_per_kind_with_its_count():
    lines = folded_lines([
        caught("transformers"), caught("torch", "Full backward hook is firing", "UserWarning"),
        caught("transformers", rank=1), caught("transformers", "another message"),
    ])
    assert lines == [
        f"transformers FutureWarning ×2: {MESSAGE} (hx.last_launch().warnings has them all)",
        "torch UserWarning ×1: Full backward hook is firing "
        "(hx.last_launch().warnings has them all)",
        "transformers FutureWarning ×1: another message "
        "(hx.last_launch().warnings has them all)",
    ]


def test_a_long_message_is_cut_at_a_space_and_ranks_not_shown_are_not_counted():
    long = "word " * 60 + "\nsecond line"
    (line,) = folded_lines([caught("torch", long, rank=0), caught("torch", long, rank=1)],
                           shown=lambda rank: rank == 0)
    assert "×1: word word" in line and " … (hx.last_launch()" in line
    assert "second line" not in line and len(line) < 180


NOISY_LIBRARY = '''
import warnings

MESSAGE = "`old_api` is deprecated and will be removed"


def old_api():
    warnings.warn(MESSAGE, FutureWarning)


def older_api():  # another location with the same message: Python shows both
    warnings.warn(MESSAGE, FutureWarning)
'''

kernel = kernel_fixture("import hfxla_nb as hx", fork_quiet=True)


@pytest.mark.kernel
def test_a_launch_folds_library_warnings_and_shows_the_users_own(kernel, tmp_path):
    site = tmp_path / "site-packages"
    site.mkdir()
    (site / "noisylib.py").write_text(NOISY_LIBRARY)
    output = run_ok(kernel, textwrap.dedent(f"""
        import sys, warnings
        sys.path.insert(0, {str(site)!r})
        import noisylib

        def noisy():
            noisylib.old_api()
            noisylib.older_api()
            warnings.warn("my own warning", UserWarning)
            return 1

        hx.notebook_launcher(noisy, progress=False)
        """))
    folded = [line for line in output.stderr.splitlines() if "noisylib" in line]
    assert len(folded) == 1, output.stderr
    assert "noisylib FutureWarning ×2: `old_api` is deprecated" in folded[0]
    assert "hx.last_launch().warnings has them all" in folded[0]
    # The user's warning, as Python shows it: where, category and message.
    assert "UserWarning: my own warning" in output.stderr
    assert "site-packages/noisylib.py" not in output.stderr
    kept = kernel.value("[(w.package, w.category, w.lineno) for w in hx.last_launch().warnings]")
    assert kept == [("noisylib", "FutureWarning", 8), ("noisylib", "FutureWarning", 12)]
