"""StepPayload: everything one device step needs, as numpy arrays, and its own wire format.

A multi-host run sends each step's payload from process 0 to the others (docs/architecture/09-sharding.md, "Sharding"),
so the payload turns itself into bytes and back: `np.savez` of flat names (`inputs.input_ids`, `sampling.top_p`, ...),
no pickle. Nested dataclasses are walked field by field, so a new field of StepInputs or SamplingTensors travels with
no edit here; a new payload field is edited in this class only. A draft model's or EAGLE-3 head's proposal step
travels as a `ProposalPayload`.
"""

from __future__ import annotations

import dataclasses
import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from vllm_jax.model.step_inputs import StepInputs
from vllm_jax.sample.sampler import SamplingTensors
from vllm_jax.spec_decode.device.draft_chain import ChainInputs


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


@dataclass
class ProposalPayload:
    """A draft model's chain or an EAGLE-3 head's catch-up and chain: what process 0 broadcasts before running it,
    so every process runs the same proposal program after the same step (docs/architecture/08-sampling.md,
    "Speculative decoding"). Its bytes start with `MAGIC`, which a StepPayload's (a zip) never do."""

    chain: ChainInputs | None  # the chain's packed inputs (EAGLE-3 with k = 1: none)
    catch_up: StepInputs | None = None  # EAGLE-3 only: the head's catch-up step
    gather: np.ndarray | None = None  # EAGLE-3 only: [T] the target token each catch-up token reads states from

    MAGIC = b"vllm_jax proposal\n"

    def to_bytes(self) -> bytes:
        arrays = {}
        for prefix in ("chain", "catch_up"):
            if (value := getattr(self, prefix)) is not None:
                arrays |= _flatten(prefix, value)
        if self.gather is not None:
            arrays["gather"] = np.asarray(self.gather)
        buffer = io.BytesIO(self.MAGIC)
        buffer.seek(len(self.MAGIC))
        np.savez(buffer, **arrays)
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> ProposalPayload:
        with np.load(io.BytesIO(data[len(cls.MAGIC):]), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
        chain, catch_up = _unflatten("chain", arrays), _unflatten("catch_up", arrays)
        return cls(ChainInputs(**chain) if chain else None, StepInputs(**catch_up) if catch_up else None,
                   arrays.get("gather"))

    @classmethod
    def is_proposal(cls, data: bytes) -> bool:
        return data.startswith(cls.MAGIC)


def _flatten(prefix: str, obj: Any) -> dict[str, np.ndarray]:
    """A dataclass's set fields as `prefix.name` arrays (None fields are left out and come back as defaults)."""
    return {f"{prefix}.{f.name}": np.asarray(value) for f in dataclasses.fields(obj)
            if (value := getattr(obj, f.name)) is not None}


def _unflatten(prefix: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    start = f"{prefix}."
    return {name[len(start):]: value for name, value in arrays.items() if name.startswith(start)}
