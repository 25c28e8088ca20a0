"""StepPayload: everything one device step needs, as numpy arrays, and its own wire format.

A multi-host run sends each step's payload from process 0 to the others (docs/architecture/09-sharding.md, "Sharding"),
so the payload turns itself into bytes and back: `np.savez` of flat names (`inputs.input_ids`, `sampling.top_p`, ...),
no pickle. Nested dataclasses are walked field by field, so a new field of StepInputs or SamplingTensors travels with
no edit here; a new payload field is edited in this class only.
"""

from __future__ import annotations

import dataclasses
import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from vllm_jax.model.step_inputs import StepInputs
from vllm_jax.sample.sampler import SamplingTensors


@dataclass
class StepPayload:
    inputs: StepInputs  # numpy, bucket-shaped
    sampling: SamplingTensors  # numpy, [S] rows (+ [S, V] in the full variant)
    num_logprobs: int  # static: -1 none, else the engine's max_logprobs
    prompt_targets: np.ndarray | None = None  # [T]: score these tokens (prompt logprobs); LM head on every row
    # Async scheduling (docs/architecture/02-engine.md, "Async scheduling"): [T] the input-batch slot whose latest
    # sample is this token (the host has not seen it yet), -1 where `inputs.input_ids` holds it; None: no such token.
    input_token_slots: np.ndarray | None = None
    # [S] each row's input-batch slot, where the device records its sample for the next step (padding rows: the
    # spare last slot); None when nothing is recorded (async scheduling off).
    sample_slots: np.ndarray | None = None

    def to_bytes(self) -> bytes:
        arrays = {"num_logprobs": np.array(self.num_logprobs, np.int64)}
        arrays |= _flatten("inputs", self.inputs) | _flatten("sampling", self.sampling)
        for name in _OPTIONAL_ARRAYS:
            if (value := getattr(self, name)) is not None:
                arrays[name] = np.asarray(value)
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> StepPayload:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
        return cls(inputs=StepInputs(**_unflatten("inputs", arrays)),
                   sampling=SamplingTensors(**_unflatten("sampling", arrays)),
                   num_logprobs=int(arrays["num_logprobs"]),
                   **{name: arrays.get(name) for name in _OPTIONAL_ARRAYS})


_OPTIONAL_ARRAYS = ("prompt_targets", "input_token_slots", "sample_slots")


def _flatten(prefix: str, obj: Any) -> dict[str, np.ndarray]:
    """A dataclass's set fields as `prefix.name` arrays (None fields are left out and come back as defaults)."""
    return {f"{prefix}.{f.name}": np.asarray(value) for f in dataclasses.fields(obj)
            if (value := getattr(obj, f.name)) is not None}


def _unflatten(prefix: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    start = f"{prefix}."
    return {name[len(start):]: value for name, value in arrays.items() if name.startswith(start)}
