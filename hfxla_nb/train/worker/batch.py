"""One batch on the device, as a task's hooks read it: `Batch`.

A batch is a set of named tensors: the int32 `tokens` (model inputs side by side, the label
columns, and in evaluation a weight column), and fields of any dtype (`pixel_values`, audio
features) that the host packed into one buffer per dtype (`batching.HostBatch`). Every array
goes up in one host-to-device call, and a field is a slice of its buffer, traced into the
step's graph: a task that carries float32 pixel values compiles the graphs a token-only task
compiles. torch_xla counts that call as one transfer, except under SPMD, where it transfers
each array by itself: one more transfer per step for each dtype the fields add.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from ..batching import FieldSlot


class Batch:
    """One batch on the device.

    Attributes:
        length: the bucket's padded length.
        tokens: `[rows, columns]` int32: the token inputs side by side (`inputs()` names
            them), then the label columns, then (evaluation) the weight column.
        tensors: every uploaded tensor (`tokens` first), as the graph takes them.
    """

    def __init__(self, length: int, tensors: Sequence[torch.Tensor],
                 slots: Sequence[FieldSlot], input_names: Sequence[str]) -> None:
        self.length = length
        self.tensors = list(tensors)
        self.tokens = self.tensors[0]
        self._slots = {slot.name: slot for slot in slots}
        self._input_names = list(input_names)

    def micro(self, index: int) -> Batch:
        """Micro-batch `index` of a batch uploaded as `[micro-batches, rows, columns]`."""
        return Batch(self.length, [tensor[index] for tensor in self.tensors],
                     list(self._slots.values()), self._input_names)

    def __getitem__(self, name: str) -> torch.Tensor:
        """The field `name`, `[rows, ...]` in the dtype the host gave it."""
        if name not in self._slots:
            raise KeyError(f"the batch has no field {name!r}; it has "
                           f"{', '.join(self._slots) or 'token columns only'}.")
        slot = self._slots[name]
        values = self.tensors[slot.buffer][..., slot.start:slot.stop]
        return values.reshape(*values.shape[:-1], *slot.shape)

    def __contains__(self, name: object) -> bool:
        return name in self._slots

    @property
    def weights(self) -> torch.Tensor:
        """`[rows]` int32: 1 for a real evaluation row, 0 for a filler row."""
        return self.tokens[:, -1]

    def inputs(self) -> dict[str, torch.Tensor]:
        """The model inputs by name (`plan.data.input_names`): fields as they are, token
        inputs as `[rows, length]` slices of `tokens`, in the order they were packed."""
        inputs = {}
        token_index = 0
        for name in self._input_names:
            if name in self._slots:
                inputs[name] = self[name]
                continue
            start = token_index * self.length
            inputs[name] = self.tokens[:, start:start + self.length]
            token_index += 1
        return inputs
