"""`Checkpoint`: random access, by slice, to a checkpoint's tensors under their HF names, in HF layout.

Sharded loading asks for each device's slice of each tensor, so a format that can read a slice without the
rest (memory-mapped safetensors) never makes a full host copy of the model. Implementations:
`safetensors_checkpoint.SafetensorsCheckpoint` and `gguf_file.GGUFCheckpoint`.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class Checkpoint(Protocol):
    path: str

    def names(self) -> set[str]: ...

    def shape(self, name: str) -> tuple[int, ...]: ...

    def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray: ...

    def where(self, name: str) -> str:
        """The file holding `name`, for error messages."""
        ...
