"""What a feature's programs need to join warm-up's plan (docs/architecture/05-worker.md, "Compilation and
warm-up"): the plan's form, the part a feature implements, and what the compilation manager offers it. A leaf of
worker/, so the features' device sides import it and the manager imports no feature's plan code."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from vllm_jax.model.step_inputs import StepInputs

# (label, make-it-ready) per program, in a fixed order
WarmupPlan = list[tuple[str, Callable[[], object]]]


class WarmupContext(Protocol):
    """The compilation manager's side a part uses: the step's shapes, the engine's DeviceStep, empty inputs."""

    shapes: Any  # StepShapes
    device: Any  # the engine's DeviceStep

    def empty_inputs(self, num_tokens: int, num_seqs: int) -> StepInputs: ...


class WarmupPart(Protocol):
    """A feature's programs in warm-up's plan: a draft model's or EAGLE-3 head's, the vision encoder's, the
    multi-step chunk's. The manager asks each part, in the order given, after each token bucket's forward
    (`bucket_plan`) and after every bucket (`final_plan`); it waits for `device_arrays` once the plan ran."""

    def bucket_plan(self, manager: WarmupContext, num_tokens: int, num_seqs: int) -> WarmupPlan: ...

    def final_plan(self, manager: WarmupContext) -> WarmupPlan: ...

    def device_arrays(self) -> list: ...
