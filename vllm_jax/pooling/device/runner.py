"""The pooling runner (vLLM's `--runner pooling`): prompts in, one pooled vector per finished prompt out.

The same scheduling, input batch, buckets and chunked prefill as generation; the step runs the forward to the
normed hidden states and the pooler (pooling/device/pooling_step.py) instead of the LM head and sampler. A row whose
prompt's last chunk ran reports its vector in `ModelRunnerOutput.pooler_output` and one placeholder token, which
ends its request (max_tokens 1): it never takes a decode step (docs/architecture/14-pooling.md, "A pooling
request").
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np

from vllm_jax.config import EngineConfig
from vllm_jax.model.step_inputs import StepInputs
from vllm_jax.pooling.device.pooler import PoolInputs
from vllm_jax.scheduler.output import ModelRunnerOutput, SchedulerOutput
from vllm_jax.worker.model_runner import ModelRunner
from vllm_jax.worker.request_state import update_request_states

PLACEHOLDER_TOKEN = 0  # what a finished prompt "samples": nobody reads it, its request ends on it


@dataclass
class PoolingFlight:
    """A dispatched pooling step: its rows, which of them finish their prompt, their kept entries, the result."""

    req_ids: list[str]
    completes: np.ndarray
    dims: list[int]
    pooled: jax.Array  # [S, D] on the device (its copy to the host started)


class PoolingModelRunner(ModelRunner):
    def __init__(self, config: EngineConfig, **kwargs):
        if jax.process_count() > 1:
            raise ValueError("runner 'pooling' runs in one process (multi-host is not supported yet)")
        super().__init__(config, **kwargs)
        self.pooler = config.pooler_config
        self.output_size = self.pooler.num_labels or self.spec.hidden_size

    def dispatch(self, sched: SchedulerOutput) -> PoolingFlight | None:
        update_request_states(self.requests, sched)
        self.input_batch.update(sched)
        if not sched.num_scheduled_tokens:
            return None
        req_ids, slots, counts, num_tokens, num_seqs = self.scheduled_rows(sched)
        batch = self.input_batch
        inputs = batch.pack(slots, counts, block_size=self.block_size, num_tokens_padded=num_tokens,
                            num_seqs_padded=num_seqs)
        dims = [self.dimensions(req_id) for req_id in req_ids]
        pool = pool_inputs(inputs, slots, counts, batch.num_computed[slots] == 0, batch.num_tokens[slots], dims,
                           spare_slot=batch.num_slots)
        return PoolingFlight(req_ids, batch.completes(slots, counts), dims, self.device.pooling.launch(inputs, pool))

    def finish(self, flight: PoolingFlight | None) -> ModelRunnerOutput:
        if flight is None:
            return ModelRunnerOutput(req_ids=[], sampled_token_ids=[])
        pooled = np.asarray(flight.pooled)
        completes = flight.completes.tolist()
        out = ModelRunnerOutput(req_ids=flight.req_ids,
                                sampled_token_ids=[[PLACEHOLDER_TOKEN] if done else [] for done in completes])
        out.pooler_output = {req_id: pooled[i, :dims].tolist()
                             for i, (req_id, done, dims) in enumerate(zip(flight.req_ids, completes, flight.dims))
                             if done}
        return out

    def dimensions(self, req_id: str) -> int:
        """The entries a request keeps: its `dimensions` (Matryoshka), the pooler config's, else all."""
        asked = getattr(self.requests[req_id].sampling_params, "dimensions", None)
        return asked or self.pooler.dimensions or self.output_size


def pool_inputs(inputs: StepInputs, slots: np.ndarray, counts: np.ndarray, starts: np.ndarray,
                prompt_lens: np.ndarray, dims: list[int], *, spare_slot: int) -> PoolInputs:
    """The pooler's per-row arrays for a packed step (padding rows: the spare slot, nothing kept)."""
    num_tokens, num_seqs, rows = inputs.input_ids.shape[0], inputs.logits_indices.shape[0], len(slots)
    qsl = np.asarray(inputs.query_start_loc)
    token_rows = np.full(num_tokens, num_seqs, np.int32)
    token_rows[:int(counts.sum())] = np.repeat(np.arange(rows, dtype=np.int32), counts)
    padded_slots = np.full(num_seqs, spare_slot, np.int32)
    padded_slots[:rows] = slots
    padded_starts = np.zeros(num_seqs, np.bool_)
    padded_starts[:rows] = starts
    lens = np.ones(num_seqs, np.float32)
    lens[:rows] = prompt_lens
    kept = np.zeros(num_seqs, np.int32)
    kept[:rows] = dims
    first = np.minimum(qsl[:num_seqs], num_tokens - 1).astype(np.int32)
    return PoolInputs(token_rows=token_rows, first_index=first, last_index=np.asarray(inputs.logits_indices),
                      slots=padded_slots, starts=padded_starts, num_tokens=lens, dims=kept)


def runner_class(config: EngineConfig) -> type[ModelRunner]:
    """The runner an engine of `config` runs: pooling or generation (vLLM's --runner)."""
    return PoolingModelRunner if config.pooler_config is not None else ModelRunner
