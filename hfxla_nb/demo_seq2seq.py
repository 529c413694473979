"""The old import path of `hfxla_nb.demo.seq2seq` (the seq2seq demo), kept for older notebooks."""

from .demo.seq2seq import *  # noqa: F403
from .demo.seq2seq import main

if __name__ == "__main__":
    raise SystemExit(main())
