"""Multi-host: `jax.distributed.initialize`, and process 0 broadcasting each step's payload to the others.

Every process holds the same params shards and KV shards for its devices and must run the same jitted step on
the same inputs. Process 0 runs the scheduler; before each device step it broadcasts the step's numpy payload
(serialized with `np.savez`, no pickle) through a jax collective, and the other processes run the same step.
Payload sizes are rounded up to powers of two so the broadcast compiles for few shapes.
"""

from __future__ import annotations

import io
import logging

import jax
import numpy as np

logger = logging.getLogger(__name__)

_STOP = -1


def initialize_distributed(coordinator: str | None, num_processes: int | None, process_id: int | None) -> None:
    """Join the process group; on CPU, use gloo collectives. Without arguments jax reads its own environment
    (e.g. on a TPU pod); call only when a multi-process run was asked for."""
    if jax.config.jax_platforms in (None, "", "cpu") or "cpu" in str(jax.config.jax_platforms):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)
    logger.info("process %d of %d joined (%d global devices)", jax.process_index(), jax.process_count(),
                len(jax.devices()))


def broadcast_payload(payload):
    """Process 0 passes its payload and gets it back; the others pass None and receive it (None = stop)."""
    from jax.experimental import multihost_utils

    from vllm_jax.worker.device_step import StepPayload

    data = _encode(payload) if payload is not None else np.zeros(0, np.uint8)
    length = int(multihost_utils.broadcast_one_to_all(np.array(len(data) if payload is not None else 0, np.int64)))
    if length == _STOP or (payload is None and length == 0 and jax.process_index() == 0):
        return None
    size = 1 << max(length - 1, 1).bit_length()
    buffer = np.zeros(size, np.uint8)
    if jax.process_index() == 0:
        buffer[:length] = data
    received = np.asarray(multihost_utils.broadcast_one_to_all(buffer))[:length]
    return payload if jax.process_index() == 0 else _decode(received.tobytes(), StepPayload)


def broadcast_stop() -> None:
    from jax.experimental import multihost_utils

    multihost_utils.broadcast_one_to_all(np.array(_STOP, np.int64))


def _encode(payload) -> np.ndarray:
    arrays = {"num_logprobs": np.array(payload.num_logprobs)}
    for prefix, obj in (("inputs", payload.inputs), ("sampling", payload.sampling)):
        for name, value in vars(obj).items():
            if value is not None:
                arrays[f"{prefix}.{name}"] = np.asarray(value)
    if payload.prompt_targets is not None:
        arrays["prompt_targets"] = payload.prompt_targets
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return np.frombuffer(buf.getvalue(), np.uint8)


def _decode(data: bytes, payload_cls):
    from vllm_jax.model.step_inputs import StepInputs
    from vllm_jax.sample.sampler import SamplingTensors

    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    fields = {"inputs": {}, "sampling": {}}
    for key, value in arrays.items():
        if "." in key:
            prefix, name = key.split(".", 1)
            fields[prefix][name] = value
    return payload_cls(StepInputs(**fields["inputs"]), SamplingTensors(**fields["sampling"]),
                       int(arrays["num_logprobs"]), arrays.get("prompt_targets"))
