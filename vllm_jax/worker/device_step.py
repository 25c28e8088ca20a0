"""The device side of one step: the jitted programs, the donated KV cache, and a numpy payload -> numpy result.

Everything a step needs crosses in one `StepPayload` of numpy arrays, so a multi-host deployment can broadcast it
from process 0 and every process launches the same programs on identical inputs (jax's multi-controller model).
Results come back replicated, so each process can read them from its own devices (docs/architecture/01-overview.md,
"Data flow of one step").

`launch` only dispatches: jax runs the programs asynchronously and the result stays on the device until `fetch`,
so the host can prepare the next step meanwhile (async scheduling). For that the device keeps the latest sampled
token of every input-batch slot (`token_feedback`): a step records its samples there, and the next step's decode
tokens that the host does not know yet are read from it (docs/architecture/02-engine.md, "Async scheduling").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from vllm_jax.lora.device.slots import LoRASlotArrays
from vllm_jax.model.decoder import forward
from vllm_jax.model.step_inputs import StepInputs
from vllm_jax.sample.sampler import (
    SamplerOutput,
    SamplingTensors,
    basic_tensors,
    compute_logprobs,
    process_logits,
    sample_processed,
)
from vllm_jax.worker.compilation_cache import ProgramStore, count_cache_lookups
from vllm_jax.worker.programs import CompiledPrograms, fetch_to_host, input_signature
from vllm_jax.worker.step_payload import StepPayload


@dataclass
class StepResult:
    sampled: SamplerOutput  # numpy once fetched (device arrays from `launch`)
    prompt_logprobs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # ids, logprobs, ranks: [T, 1+K]


class DeviceStep(CompiledPrograms):
    """The jitted forward, sampler and prompt-logprobs programs over the params and the donated KV cache.

    Warm-up precompiles the forward and sampler for every bucket (`precompile_forward` / `precompile_sample`):
    the executables are loaded from the `ProgramStore` when it has them, else lowered, compiled and stored
    (worker/programs.py). A call whose input shapes have a precompiled executable runs it; any other goes through
    `jax.jit`, which traces (each trace calls `on_trace`: the compilation manager counts them) and compiles on
    first use. Features attach programs of their own (LoRA's slot writes, pooling's pooler); pooling replaces
    the forward (`use_forward`).
    """

    def __init__(self, graphdef: nnx.GraphDef, params: nnx.State, kv_cache: jax.Array, mesh: Mesh,
                 max_logprobs: int, store: ProgramStore | None = None, on_trace: Callable[[], None] = lambda: None,
                 num_slots: int = 0, returns_aux: bool = False):
        """`num_slots`: the input batch's rows (the runner's max_num_seqs); `token_feedback` holds one more, the
        row padding rows write to."""
        super().__init__(mesh, store=store, on_trace=on_trace)
        self.graphdef, self.params, self.kv_cache = graphdef, params, kv_cache
        self.max_logprobs = max_logprobs
        self.returns_aux = returns_aux  # the model has aux_hidden_layers (EAGLE-3): see forward
        # LoRA's stacked adapter slots (lora/device/slots.py), an extra argument of the forward; None: LoRA off and
        # the forward is exactly the one without LoRA.
        self.lora: LoRASlotArrays | None = None
        # A pooling engine's programs (pooling/device/pooling_step.py); attaching them replaces the forward with
        # one that ends at the final norm.
        self.pooling: Any = None
        self.aux_hidden: jax.Array | None = None
        replicated = self.replicated
        self._forward = jax.jit(self._forward_impl, donate_argnums=(1,))
        self._sample = jax.jit(self._sample_impl, static_argnums=(4,), out_shardings=replicated)
        self._process: dict[Any, Any] = {}  # the logits processors' jitted program, by the logits' sharding
        self._prompt_logprobs = jax.jit(self._prompt_logprobs_impl, static_argnums=(2,), out_shardings=replicated)
        self._record = jax.jit(self._record_impl, donate_argnums=(0,), out_shardings=replicated)
        self._feed = jax.jit(self._feed_impl, out_shardings=replicated)
        if isinstance(kv_cache, jax.ShapeDtypeStruct):  # an ahead-of-time compile: nothing lives on a device
            self.token_feedback = jax.ShapeDtypeStruct((num_slots + 1,), jnp.int32, sharding=replicated)
        else:
            self.token_feedback = jax.device_put(np.zeros(num_slots + 1, np.int32), replicated)

    def use_forward(self, body: Callable[..., Any]) -> None:
        """Run `body(params, kv_cache, inputs, lora=None) -> (kv_cache, out)` as the forward instead (the KV cache
        donated): the pooling runner's, which ends at the final norm. Before warm-up only."""
        self._forward = jax.jit(body, donate_argnums=(1,))

    # A trace happens once per new shape or variant: each one reports itself.
    def _forward_impl(self, params, kv_cache, inputs: StepInputs, lora=None):
        self.on_trace()
        return forward(self.graphdef, params, kv_cache, inputs, lora)

    def _lora_args(self) -> tuple:
        return () if self.lora is None else (self.lora.arrays,)

    def _sample_impl(self, masked, processed, tensors: SamplingTensors, logprobs_on, num_logprobs: int):
        self.on_trace()
        return sample_processed(masked, processed, tensors, num_logprobs, logprobs_on)

    def _process_impl(self, logits, tensors: SamplingTensors):
        self.on_trace()
        return process_logits(logits, tensors)

    def _process_program(self, logits: Any) -> Any:
        """The logits processors' jitted program, its outputs laid out as its input `logits` (so the sampling
        program compiled for the forward's logits takes them)."""
        sharding = logits.sharding
        if sharding not in self._process:
            self._process[sharding] = jax.jit(self._process_impl, out_shardings=(sharding, sharding))
        return self._process[sharding]

    def _prompt_logprobs_impl(self, logits, targets, num_logprobs: int):
        self.on_trace()
        return compute_logprobs(logits, targets, num_logprobs)

    def _record_impl(self, feedback, slots, token_ids):
        self.on_trace()
        return feedback.at[slots].set(token_ids)

    def _feed_impl(self, feedback, input_ids, token_slots):
        self.on_trace()
        return jnp.where(token_slots >= 0, feedback[jnp.maximum(token_slots, 0)], input_ids)

    def forward(self, inputs: StepInputs) -> jax.Array:
        """The forward on bucket-shaped inputs; updates the KV cache in place; [S or T, vocab] float32 logits.
        A model with `aux_hidden_layers` (EAGLE-3) also leaves its [T, K * hidden] states in `aux_hidden`."""
        program = self.program(("forward", input_signature(inputs)), self._forward)
        self.kv_cache, logits, *aux = program(self.params, self.kv_cache, self.to_device(inputs),
                                              *self._lora_args())
        self.aux_hidden = aux[0] if aux else None
        return logits

    def launch(self, payload: StepPayload) -> StepResult:
        """Dispatch the step's programs; the result's arrays stay on the device (their copy to the host starts)."""
        inputs = payload.inputs
        if payload.input_token_slots is not None:  # decode tokens the host has not seen: last step's samples
            inputs = dataclasses.replace(inputs, input_ids=self.feed_tokens(inputs.input_ids,
                                                                            payload.input_token_slots))
        prompt_lp = None
        if payload.prompt_targets is None:
            logits = self.forward(inputs)
        else:
            num_tokens = inputs.input_ids.shape[0]
            all_rows = dataclasses.replace(inputs, logits_indices=np.arange(num_tokens, dtype=np.int32))
            all_logits = self.forward(all_rows)
            targets = self.to_device(payload.prompt_targets)
            prompt_lp = self._prompt_logprobs(all_logits, targets, self.max_logprobs)
            logits = all_logits[self.to_device(inputs.logits_indices)]
        sampled = self.sample(logits, payload.sampling, payload.num_logprobs)
        if payload.sample_slots is not None:
            self.record_tokens(payload.sample_slots, sampled.token_ids)
        result = StepResult(sampled, prompt_lp)
        for leaf in jax.tree.leaves((sampled, prompt_lp)):
            if isinstance(leaf, jax.Array) and leaf.is_fully_addressable:
                leaf.copy_to_host_async()
        return result

    @staticmethod
    def fetch(result: StepResult) -> StepResult:
        """The launched step's result as host numpy (waits for the device)."""
        return StepResult(fetch_to_host(result.sampled), fetch_to_host(result.prompt_logprobs))

    def sample(self, logits: jax.Array, tensors: SamplingTensors, num_logprobs: int) -> SamplerOutput:
        """The sampler's output, on the device; its logprobs are None when `num_logprobs` is NO_LOGPROBS (-1).

        One sampling program per sequence bucket serves both variants and steps with and without logprobs: the
        full variant's [S, V] processors run first as a program of their own, and the sampling program always
        has the engine's max_logprobs columns, computed only when a row asked (docs/architecture/08-sampling.md,
        "Sampling")."""
        wanted = num_logprobs >= 0
        tensors, flag = self.to_device((tensors, np.array(wanted)))
        masked = processed = logits
        if tensors.is_full:
            key = ("process", input_signature(tensors))
            program = self.program(key, None) or self._process_program(logits)
            masked, processed = program(logits, tensors)
            tensors = basic_tensors(tensors)
        executable = self.program(("sample", input_signature(tensors)), None)
        if executable is not None:
            sampled = executable(masked, processed, tensors, flag)
        else:
            sampled = self._sample(masked, processed, tensors, flag, self.max_logprobs)
        if not wanted:  # zeros: never copied to the host
            sampled = dataclasses.replace(sampled, logprob_token_ids=None, logprobs=None, ranks=None)
        return sampled

    def feed_tokens(self, input_ids: np.ndarray, token_slots: np.ndarray) -> jax.Array:
        """`input_ids` with each token whose slot `token_slots` names (>= 0) read from `token_feedback`."""
        args = self.to_device((input_ids, token_slots))
        program = self.program(("feed", input_signature(args)), self._feed)
        return program(self.token_feedback, *args)

    def record_tokens(self, slots: np.ndarray, token_ids: jax.Array) -> None:
        """Write each row's sampled token to its slot of `token_feedback` (donated: updated in place)."""
        slots = self.to_device(slots)
        program = self.program(("record", input_signature((slots, token_ids))), self._record)
        self.token_feedback = program(self.token_feedback, slots, token_ids)

    def precompile_feed(self, num_tokens: int) -> None:
        """Async scheduling's warm-up: the token-feed program of a token bucket."""
        dynamic = self.to_device((np.zeros(num_tokens, np.int32), np.full(num_tokens, -1, np.int32)))
        args = (self.token_feedback, *dynamic)
        self.make_ready(("feed", input_signature(dynamic)), self._feed, args, args, 0)

    def precompile_record(self, num_seqs: int) -> None:
        """Async scheduling's warm-up: the token-record program of a sequence bucket (the sampler's ids come
        replicated, as here)."""
        slots = self.to_device(np.zeros(num_seqs, np.int32))
        if isinstance(self.token_feedback, jax.ShapeDtypeStruct):  # an ahead-of-time compile
            token_ids = jax.ShapeDtypeStruct((num_seqs,), jnp.int32, sharding=self.replicated)
        else:
            token_ids = jax.device_put(np.zeros(num_seqs, np.int32), self.replicated)
        args = (self.token_feedback, slots, token_ids)
        self.make_ready(("record", input_signature((slots, token_ids))), self._record, args, args, 0)

    def precompile_lora_write(self) -> None:
        """LoRA's warm-up: the slot-write program (run once on zeros; an ahead-of-time compile only compiles it
        for its target)."""
        if self.lora.abstract:
            args = self.lora.write_args()
            self.load_or_compile(("lora_write",), self.lora.write_program, args, args, args[0])
        else:
            self.lora.warmup()

    def adopt(self, other: DeviceStep) -> None:
        """Take the programs a KV probe compiled (`other`: same params and mesh; kv_budget.sized_by_probes): its
        samplers, which read no cache, always; the rest (its forward) only when compiled for this very step: the
        same class, cache (shape, dtype, sharding) and slots, no LoRA arrays, no pooling programs (whose forward
        is another). Adopted fresh compiles are stored in this step's compilation cache, as its own would be."""
        same_step = (type(other) is type(self) and other.lora is None and self.lora is None
                     and other.pooling is None and self.pooling is None and other.returns_aux == self.returns_aux
                     and _aval(other.kv_cache) == _aval(self.kv_cache)
                     and other.token_feedback.shape == self.token_feedback.shape)
        self.adopt_programs(other, lambda key: key[0] in ("sample", "process") or same_step)

    # --- warm-up ---
    def precompile_forward(self, inputs: StepInputs) -> jax.ShapeDtypeStruct:
        """Make the forward for these input shapes ready; returns the logits' abstract value (for the sampler)."""
        key, args, outputs = self._forward_call(inputs)
        self.make_ready(key, self._forward, args, args, outputs)
        return self.forward_outputs(inputs)[1]

    def precompile_forwards(self, inputs: list[StepInputs], max_workers: int) -> tuple[int, int]:
        """Make the forwards for all these input shapes ready (loaded from the store, or compiled up to
        `max_workers` at once); returns (how many it made ready, how many of them it compiled). Tracing and
        lowering stay on this thread (Python); XLA's compiles, which release the GIL, run side by side: an unrolled
        forward takes seconds to compile on a GPU (docs/accelerators.md, "On an NVIDIA H200"), and the buckets'
        forwards are independent programs."""
        pending, ready = [], 0
        for one in inputs:
            key, args, outputs = self._forward_call(one)
            if self.is_ready(key):  # the buckets' shapes are distinct: no key comes twice
                continue
            executable = self.load_stored(key, args, outputs)
            if executable is not None:
                self.keep(key, executable)
                ready += 1
            else:
                pending.append((key, args, outputs, self._forward.lower(*args)))
        if pending:
            with count_cache_lookups() as jax_cache, ThreadPoolExecutor(min(max_workers, len(pending))) as pool:
                executables = list(pool.map(lambda p: p[3].compile(), pending))
            for (key, args, outputs, _), executable in zip(pending, executables):
                self.keep(key, executable)
                if jax_cache.hits == 0:  # as load_or_compile: a program jax read from its own cache is not stored
                    self.store_compiled(key, executable, args, outputs)
        return ready + len(pending), len(pending)

    def _forward_call(self, inputs: StepInputs) -> tuple[tuple, tuple, tuple]:
        """(program key, arguments, outputs' pytree shape) of the forward for these inputs."""
        args = (self.params, self.kv_cache, self.to_device(inputs), *self._lora_args())
        return ("forward", input_signature(inputs)), args, (0, 0, 0) if self.returns_aux else (0, 0)

    def forward_outputs(self, inputs: StepInputs) -> list[jax.ShapeDtypeStruct]:
        """The precompiled forward's outputs as abstract values: kv_cache, logits (and the aux states)."""
        executable = self.executable(("forward", input_signature(inputs)))
        return [jax.ShapeDtypeStruct(info.shape, info.dtype, sharding=sharding)
                for info, sharding in zip(executable.out_info, executable.output_shardings)]

    def precompile_sample(self, logits: jax.ShapeDtypeStruct, tensors: SamplingTensors) -> None:
        """Make the sampling program for these sampling tensors' basic signature ready (either variant's steps,
        with and without logprobs: see sample)."""
        tensors, logprobs_on = self.to_device((basic_tensors(tensors), np.array(False)))
        accepted = None if tensors.draft_token_ids is None else 0  # see sampler.sample
        args = (logits, logits, tensors, logprobs_on)
        self.make_ready(("sample", input_signature(tensors)), self._sample, (*args, self.max_logprobs), args,
                        SamplerOutput(0, 0, 0, 0, accepted))

    def precompile_process(self, logits: jax.ShapeDtypeStruct, tensors: SamplingTensors) -> None:
        """Make the full variant's logits-processors program for these (full) sampling tensors ready."""
        tensors = self.to_device(tensors)
        key = ("process", input_signature(tensors))
        if not self.is_ready(key):
            args = (logits, tensors)
            self.make_ready(key, self._process_program(logits), args, args, (0, 0))


def _aval(cache: Any) -> list[tuple]:
    """Shape, dtype and sharding of each array of a cache (a hybrid model's is a pytree)."""
    return [(tuple(x.shape), jnp.dtype(x.dtype), x.sharding) for x in jax.tree.leaves(cache)]
