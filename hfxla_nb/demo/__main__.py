"""`python -m hfxla_nb.demo`: the embedded default fine-tune (`make demo`)."""

from . import main

raise SystemExit(main())
