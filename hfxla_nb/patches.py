"""`hfxla_nb.patches`: the import path of `hfxla_nb.train.patches` (`hx.patches`).

`import hfxla_nb.patches` and `from hfxla_nb import patches` give the one module that holds
the patches and their state (which ones are applied), not a copy of its names: this module
puts that one in its own place in `sys.modules` while it is imported, and the import system
hands that out.
"""

import sys

from .train import patches

sys.modules[__name__] = patches
