"""Every pytest run here (the tests, the tutorials under nbval) gets a temporary folder of its
own, which its kernels and workers inherit through TMPDIR and which is removed when it ends.

hfxla_nb keeps per-user state under the temporary folder: the notes of launches stopped when
their kernel died, which the next `%xla_info` shows. A run must see only the notes it made, not
one left by a run killed earlier on the same machine (a CI job cut off, a test interrupted), and
must leave none for a person's next kernel.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

_FOLDER = pytest.StashKey[str]()
_ORIGINAL = os.environ.get("TMPDIR")


def pytest_configure(config):
    # Short (Ray's socket paths under it must stay below 108 bytes) and under the usual one.
    folder = tempfile.mkdtemp(prefix="hfxla_nb-run-")
    config.stash[_FOLDER] = folder
    os.environ["TMPDIR"] = folder
    tempfile.tempdir = None  # read TMPDIR again


def pytest_unconfigure(config):
    folder = config.stash.get(_FOLDER, None)
    if folder is None:
        return
    if _ORIGINAL is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = _ORIGINAL
    tempfile.tempdir = None
    shutil.rmtree(folder, ignore_errors=True)



# nbval waits a fixed 5 s for each of a cell's output messages after the cell's reply. On a
# shared 2-core CI machine a kernel was once silent longer than that right after a 67-s
# fine_tune whose work had ended well, and the tutorial failed with "Timeout of 5 seconds
# exceeded waiting for output". A cell's own limit stays --nbval-cell-timeout.
NBVAL_OUTPUT_WAIT = 60.0


def pytest_collection_modifyitems(items):
    for item in items:
        if hasattr(item, "output_timeout"):  # an nbval cell
            item.output_timeout = NBVAL_OUTPUT_WAIT
