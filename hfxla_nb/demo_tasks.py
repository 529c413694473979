"""The old import path of `hfxla_nb.demo.tasks` (the NER, QA and multiple-choice demos), kept
for older notebooks."""

from .demo.tasks import *  # noqa: F403
from .demo.tasks import main

if __name__ == "__main__":
    raise SystemExit(main())
