"""Small, reversible fixes that make transformers trace cleanly on XLA.

Each patch removes a host-device synchronization (or a recompilation) that transformers
triggers on XLA, without changing what the model computes. `fine_tune` applies them inside its
launched worker and undoes them when it ends, so the notebook kernel's transformers stays
untouched. Your own loop can use them too, public as `hx.patches` (`hfxla_nb.patches`):

```python
import hfxla_nb as hx

with hx.patches.applied():       # or hx.patches.apply() ... hx.patches.remove()
    train()
```

The patches:

- `bidirectional_mask`: BERT-style encoders build their attention mask through
  `transformers.masking_utils.sdpa_mask`, which asks `_ignore_bidirectional_mask_sdpa`
  whether the padding mask can be dropped. That check evaluates `padding_mask.all()` on the
  device, every forward pass: on XLA it cuts the lazy graph in two (two executions per
  training step instead of one) and copies a boolean to the host, which also stops the next
  step's tracing from overlapping this step's execution. On XLA tensors the patched check
  answers "keep the mask". Keeping an all-ones mask gives the same attention as dropping it
  (masked positions add 0 to the scores), so results do not change; only the chance to
  dispatch to a flash kernel without a mask is lost, which XLA does not use anyway.
- `causal_mask`: the same for decoders (Llama, GPT-2 style): `_ignore_causal_mask_sdpa` reads
  `padding_mask.all()` (twice) to decide whether SDPA's `is_causal` can replace the mask; on
  XLA tensors the causal mask is always built, with the same attention.
- `packed_sequences`: a decoder given position ids and no attention mask (Whisper's, in
  training and in fixed-shape generation) has `find_packed_sequence_indices` read whether
  the rows are packed sequences, `(mask[:, -1] == 0).all()` on the device, every forward
  pass: a small graph and a fetch per step. On XLA tensors the patched function returns the
  sequence indices unread, as it does when traced by `torch.compile`; rows that are not
  packed are all one sequence (index 0 throughout), so the mask built from them is the
  causal mask it would have built without them.
- `hub_kernels`: with the `kernels` package installed (transformers 5.25 requires it),
  transformers kernelizes a model at load and again at each `model.train()` or `eval()`,
  for the model's device; `kernels` knows no "xla" device and raises "Unsupported device
  type 'xla'". On a model whose parameters are on an XLA device the patched `kernelize`
  does nothing: the model keeps transformers' own PyTorch layers, which XLA compiles.
  transformers' mapping names no kernel for the CPU, so a model kernelized at load on the
  CPU (in the notebook, or in a worker) holds those same PyTorch layers. Every launched
  worker keeps this one patch on for its whole life (`keep_hub_kernels_off_xla`), from the
  moment transformers is imported there: a model loaded in the notebook before the launch,
  with hub kernels on as transformers' default, trains and evaluates in the worker.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# Re-entrant: `apply()` imports transformers' modules, and where a worker keeps `hub_kernels`
# from the import on (`keep_hub_kernels_off_xla`) that import applies it, on the same thread.
_lock = threading.RLock()
# patch name -> (module, attribute, original value); present while applied
_applied: dict[str, tuple[Any, str, Any]] = {}
# How many `applied()` blocks are open: rank threads of one process (TPU v2/v3, XLA:CPU) each
# open one, and the patches stay until the last of them closes.
_users = 0
_outside: set[str] = set()
# Patches kept for the process's whole life: the end of an `applied()` block leaves them on.
_kept: set[str] = set()


def _on_xla(tensor: Any) -> bool:
    return getattr(getattr(tensor, "device", None), "type", None) == "xla"


def _keep_mask_on_xla(original: Callable[..., bool]) -> Callable[..., bool]:
    """`original(padding_mask, ...)`, except that on XLA tensors the mask is always kept."""

    def keep_mask(padding_mask, *args, **kwargs) -> bool:
        if _on_xla(padding_mask):
            return False  # keep the mask: reading it would sync the device (see module doc)
        return original(padding_mask, *args, **kwargs)

    keep_mask.__name__ = original.__name__
    keep_mask.__wrapped__ = original  # type: ignore[attr-defined]
    keep_mask.__hfxla_nb_patch__ = True  # type: ignore[attr-defined]
    return keep_mask


def _packed_unread_on_xla(original: Callable[..., Any]) -> Callable[..., Any]:
    """`original(position_ids)`, except that on XLA tensors the sequence indices are
    returned without reading them (see the module doc)."""

    def packed_sequences(position_ids, *args, **kwargs) -> Any:
        if not _on_xla(position_ids):
            return original(position_ids, *args, **kwargs)
        import torch

        first = position_ids[:, :1] - 1  # as the original: a diff of 1 before the first
        return (torch.diff(position_ids, prepend=first, dim=-1) != 1).cumsum(-1)

    packed_sequences.__name__ = original.__name__
    packed_sequences.__wrapped__ = original  # type: ignore[attr-defined]
    packed_sequences.__hfxla_nb_patch__ = True  # type: ignore[attr-defined]
    return packed_sequences


def _no_hub_kernels_on_xla(original: Callable[..., Any]) -> Callable[..., Any]:
    """`original(model, ...)`, except that a model on an XLA device is left as it is."""

    def kernelize(model, *args, **kwargs) -> Any:
        parameter = next(model.parameters(), None) if hasattr(model, "parameters") else None
        if _on_xla(parameter):
            return None  # no hub kernel exists for XLA (see the module doc)
        return original(model, *args, **kwargs)

    kernelize.__name__ = original.__name__
    kernelize.__wrapped__ = original  # type: ignore[attr-defined]
    kernelize.__hfxla_nb_patch__ = True  # type: ignore[attr-defined]
    return kernelize


def _targets() -> dict[str, tuple[Any, str, Callable[[Any], Any]]]:
    """name -> (module, attribute, make_replacement) for the patches this transformers has."""
    targets = {}
    try:
        from transformers import modeling_utils
    except ImportError:
        return targets
    if hasattr(modeling_utils, "kernelize"):  # transformers with hub kernels (5.x)
        targets["hub_kernels"] = (modeling_utils, "kernelize", _no_hub_kernels_on_xla)
    try:
        from transformers import masking_utils
    except ImportError:  # transformers < 4.53 builds masks elsewhere, without this check
        return targets
    for name, attribute in (("bidirectional_mask", "_ignore_bidirectional_mask_sdpa"),
                            ("causal_mask", "_ignore_causal_mask_sdpa")):
        if hasattr(masking_utils, attribute):
            targets[name] = (masking_utils, attribute, _keep_mask_on_xla)
    if hasattr(masking_utils, "find_packed_sequence_indices"):
        targets["packed_sequences"] = (masking_utils, "find_packed_sequence_indices",
                                       _packed_unread_on_xla)
    return targets


def apply(only: tuple[str, ...] | None = None) -> list[str]:
    """Apply every patch this version of transformers needs; returns the names applied.

    Idempotent: applying twice patches once. Call `remove()` to restore the originals.

    Args:
        only: the names of the patches to apply (every one when None).
    """
    names = []
    with _lock:
        for name, (module, attribute, make) in _targets().items():
            if name in _applied or (only is not None and name not in only):
                continue
            original = getattr(module, attribute)
            setattr(module, attribute, make(original))
            _applied[name] = (module, attribute, original)
            names.append(name)
    return names


def remove() -> None:
    """Restore every original that `apply()` replaced."""
    with _lock:
        for module, attribute, original in _applied.values():
            setattr(module, attribute, original)
        _applied.clear()
        _kept.clear()


def active() -> list[str]:
    """Names of the patches applied now."""
    return sorted(_applied)


@contextmanager
def applied() -> Iterator[list[str]]:
    """Apply the patches for the duration of a block; yields the names of those active.

    Blocks may overlap (one per rank thread): the originals come back when the last one ends.
    Patches applied with `apply()` outside any block stay until `remove()`.
    """
    global _users, _outside
    with _lock:
        if _users == 0:
            _outside = set(_applied)  # applied by apply() before any block: left alone
        _users += 1
    apply()
    try:
        yield active()
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                for name in list(_applied):
                    if name not in _outside and name not in _kept:
                        module, attribute, original = _applied.pop(name)
                        setattr(module, attribute, original)


def keep_hub_kernels_off_xla() -> None:
    """Keep the `hub_kernels` patch on in this process from now on (a launched worker's).

    Applied now when transformers' `modeling_utils` is already imported (a model loaded in the
    notebook before the fork), else the moment it is: the patch must be in place before the
    first `model.train()` or `eval()` of a model on an XLA device. transformers' own switch,
    `USE_HUB_KERNELS=NO`, is no substitute: a model loaded with hub kernels on raises at its
    next `train()` under it ("Hub kernels are disabled through the environment variable").
    """
    with _lock:
        _kept.add("hub_kernels")
    if _MODELING_UTILS in sys.modules:
        apply(only=("hub_kernels",))
    elif not any(isinstance(finder, _ApplyOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _ApplyOnImport())


_MODELING_UTILS = "transformers.modeling_utils"


class _ApplyOnImport(importlib.abc.MetaPathFinder):
    """Applies the `hub_kernels` patch right after `transformers.modeling_utils` is imported."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _MODELING_UTILS:
            return None
        sys.meta_path.remove(self)  # one import to watch; the other finders locate it
        spec = next((found for finder in sys.meta_path if hasattr(finder, "find_spec")
                     for found in [finder.find_spec(fullname, path, target)] if found), None)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_patch(module) -> None:
            exec_module(module)
            apply(only=("hub_kernels",))

        spec.loader.exec_module = exec_then_patch  # this spec's own loader instance
        return spec
