"""The old import path of `hfxla_nb.demo.lm` (the causal-LM demo), kept for older notebooks."""

from .demo.lm import *  # noqa: F403
from .demo.lm import main

if __name__ == "__main__":
    raise SystemExit(main())
