"""Multi-host: joining the process group, and process 0 broadcasting opaque messages to the others.

Every process holds the same params shards and KV shards for its devices and must run the same jitted step on the
same inputs. Process 0 runs the scheduler and broadcasts each step's message (bytes: the worker's payload
serializes itself) through a jax collective; the others receive it and run the same step
(docs/architecture/09-sharding.md, "Sharding"). Message sizes are rounded up to powers of two so the broadcast compiles
for few shapes. """

from __future__ import annotations

import logging

import jax
import numpy as np
from jax.experimental import multihost_utils

logger = logging.getLogger(__name__)

_STOP = -1  # the length process 0 broadcasts to end the others' receive loops


def initialize_distributed(coordinator: str | None, num_processes: int | None, process_id: int | None) -> None:
    """Join the process group; on CPU, use gloo collectives. Without arguments jax reads its own environment
    (e.g. on a TPU pod); call only when a multi-process run was asked for."""
    if jax.config.jax_platforms in (None, "", "cpu") or "cpu" in str(jax.config.jax_platforms):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)
    logger.info("process %d of %d joined (%d global devices)", jax.process_index(), jax.process_count(),
                len(jax.devices()))


def broadcast_bytes(data: bytes | None) -> bytes | None:
    """Process 0 passes its message and gets it back; every other process passes None and gets process 0's
    message, or None once process 0 called `broadcast_stop`."""
    leader = jax.process_index() == 0
    if leader and data is None:
        raise ValueError("process 0 must pass the message it broadcasts")
    length = int(multihost_utils.broadcast_one_to_all(np.array(len(data) if leader else 0, np.int64)))
    if length == _STOP:
        return None
    buffer = np.zeros(1 << max(length - 1, 1).bit_length(), np.uint8)
    if leader:
        buffer[:length] = np.frombuffer(data, np.uint8)
    received = np.asarray(multihost_utils.broadcast_one_to_all(buffer))[:length]
    return data if leader else received.tobytes()


def broadcast_stop() -> None:
    """Process 0 only: the others' `broadcast_bytes` returns None."""
    multihost_utils.broadcast_one_to_all(np.array(_STOP, np.int64))
