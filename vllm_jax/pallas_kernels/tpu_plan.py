"""How the Mosaic attention kernel cuts its work for one chip: query-tile and page-block sizes from the shapes,
shrunk until the VMEM estimate fits the chip's budget, the SMEM its scalars take, and the limit Mosaic is given.
A configuration that cannot fit is a ValueError naming the flag to change, raised while tracing, i.e. at warm-up,
never at the first request (docs/architecture/10-faults.md, "Fault policy").
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from vllm_jax.pallas_kernels.kv_layout import LANES, pair_lanes, row_lanes


def sublane_packing(dtype) -> int:
    return max(1, 4 // jnp.dtype(dtype).itemsize)


def tpu_block_sizes(*, num_tokens: int, group: int, num_kv_heads: int, head_dim: int, block_size: int,
                    kv_dtype, max_blocks_per_seq: int, kv_buffer_bytes: int = 512 * 1024) -> tuple[int, int]:
    """-> (tq tokens per query tile, pages per KV block), from the shapes only (no per-chip table).

    tq: about 128 query rows (tq * group) per MXU pass, at least 16 tokens so rows stay a multiple of the
    bfloat16 sublane tiling, at most the padded batch. Pages per block: enough pages to fill `kv_buffer_bytes`
    per buffer (two buffers live at once), at least one, at most 32 DMAs and the table width.
    """
    tq = max(16, 128 // max(group, 1))
    tq = 1 << (tq.bit_length() - 1)
    tq = min(tq, -(-num_tokens // 16) * 16)
    page_bytes = block_size * row_lanes(num_kv_heads, head_dim) * jnp.dtype(kv_dtype).itemsize
    pages = max(1, min(kv_buffer_bytes // page_bytes, 32, max_blocks_per_seq))
    return tq, pages


@dataclasses.dataclass(frozen=True)
class TpuPlan:
    """Block sizes and the VMEM limit of one attention call, chosen for one chip."""

    tq: int
    pages_per_block: int
    vmem_estimate_bytes: int  # what the plan's buffers and the main temporaries take
    vmem_limit_bytes: int  # passed to Mosaic (the scoped-VMEM limit of this kernel)
    smem_bytes: int  # scalar-prefetched arrays + the block-table windows
    chip: str


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def vmem_estimate(*, tq: int, pages_per_block: int, group: int, num_kv_heads: int, cache_kv_heads: int,
                  head_dim: int, block_size: int, q_dtype, kv_dtype, width: int | None = None) -> int:
    """VMEM bytes of one grid step: the pipelined q/o blocks (two buffers each), the two KV page buffers
    ([pages, block_size, lanes] each, lane-dense: kv_layout.py), the softmax state, and the per-head temporaries
    of one page block (scores, probabilities, mask, the pair window read out of the buffer and its casts), each
    padded to the (sublane, 128-lane) tiling. `width`: the q / output / accumulator rows (head_dim, or the pair
    window when head_dim is not a multiple of 128; default head_dim)."""
    rows = tq * group
    d = round_up(width or head_dim, LANES)
    pair = pair_lanes(head_dim)
    qi, ki = jnp.dtype(q_dtype).itemsize, jnp.dtype(kv_dtype).itemsize
    block_tokens = pages_per_block * block_size
    rows_q = round_up(rows, 8 * sublane_packing(q_dtype))
    qo = 2 * 2 * num_kv_heads * rows_q * d * qi
    kv = 2 * pages_per_block * round_up(block_size, 8 * sublane_packing(kv_dtype)) * row_lanes(cache_kv_heads,
                                                                                               head_dim) * ki
    rows32 = round_up(rows, 8)
    state = num_kv_heads * rows32 * (2 * LANES + d) * 4
    temps = 6 * rows32 * round_up(block_tokens, LANES) * 4 + 4 * block_tokens * pair * 4 + 3 * rows32 * d * 4
    return qo + kv + state + temps


def table_window(table_width: int, pages_per_block: int) -> int:
    """Columns of the block table copied into SMEM per page block (table_width is a multiple of 128)."""
    return table_width if table_width <= 128 else min(table_width, round_up(128 + pages_per_block, 128))


def _unlisted_tpu():
    """A TPU missing from chips.CHIPS (v4, v5p, ...): its VMEM and SMEM from jax's own chip info."""
    from vllm_jax.pallas_kernels.chips import CHIPS

    if jax.default_backend() != "tpu":
        return None
    try:
        from jax._src.pallas.mosaic import tpu_info
        info = tpu_info.get_tpu_info()
        return dataclasses.replace(CHIPS["v5e"], name=str(info.chip_version), vmem_bytes=info.vmem_capacity_bytes,
                                   smem_bytes=info.smem_capacity_bytes)
    except Exception:  # noqa: BLE001 pragma: no cover - private API moved: the smallest VMEM of any TPU generation
        return dataclasses.replace(CHIPS["v5e"], name="unknown TPU", vmem_bytes=16 * 2**20, smem_bytes=16 * 1024)


def tpu_plan(*, num_tokens: int, num_seqs: int, group: int, num_kv_heads: int, head_dim: int, block_size: int,
             q_dtype, kv_dtype, table_width: int, cache_kv_heads: int | None = None, chip=None,
             tq: int | None = None, pages_per_block: int | None = None, width: int | None = None) -> TpuPlan:
    """Block sizes for `chip` (an chips.ChipSpec; default: the chip being compiled for, v5e's figures
    on CPU): start from the shape rule (tpu_block_sizes), then halve the page block and then the query tile
    until the estimate fits half the VMEM limit (the rest is headroom for what the estimate does not see).
    The limit is 3/4 of the core's VMEM. A configuration that cannot fit is a ValueError naming the flag."""
    from vllm_jax.pallas_kernels.chips import CHIPS, current_chip

    chip = chip or current_chip() or _unlisted_tpu()
    if chip is None or chip.platform != "tpu":
        chip = CHIPS["v5e"]  # CPU (interpret mode): plan as v5e would
    cache_kv_heads = cache_kv_heads or num_kv_heads
    limit = chip.vmem_bytes * 3 // 4
    auto_tq, auto_pages = tpu_block_sizes(num_tokens=num_tokens, group=group, num_kv_heads=cache_kv_heads,
                                          head_dim=head_dim, block_size=block_size, kv_dtype=kv_dtype,
                                          max_blocks_per_seq=table_width)
    fixed_tq, fixed_pages = tq is not None, pages_per_block is not None
    tq, pages = tq or auto_tq, pages_per_block or auto_pages

    def estimate(tq, pages):
        return vmem_estimate(tq=tq, pages_per_block=pages, group=group, num_kv_heads=num_kv_heads,
                             cache_kv_heads=cache_kv_heads, head_dim=head_dim, block_size=block_size,
                             q_dtype=q_dtype, kv_dtype=kv_dtype, width=width)

    while estimate(tq, pages) > limit // 2:
        if pages > 1 and not fixed_pages:
            pages //= 2
        elif tq > 16 and not fixed_tq:
            tq //= 2
        else:
            page_kib = block_size * row_lanes(cache_kv_heads, head_dim) * jnp.dtype(kv_dtype).itemsize // 1024
            raise ValueError(
                f"pallas_tpu attention does not fit {chip.name}'s VMEM: {estimate(tq, pages) / 2**20:.1f} MiB "
                f"needed for {tq} query tokens x {num_kv_heads} KV heads and {pages} page(s) of {page_kib} KiB "
                f"(budget {limit // 2 / 2**20:.0f} MiB); lower --block-size, use a smaller --dtype, or shard the "
                f"heads with --tensor-parallel-size")
    num_tiles = -(-num_tokens // tq)
    smem = 4 * (2 * round_up(num_tiles, 128) + round_up(num_seqs + 1, 128) + round_up(num_seqs, 128) + 128
                + 2 * table_window(round_up(table_width, 128), pages))
    if smem > chip.smem_bytes // 2:
        raise ValueError(
            f"pallas_tpu attention's scalars need {smem / 1024:.0f} KiB of SMEM, more than half of {chip.name}'s "
            f"{chip.smem_bytes // 1024} KiB: lower --max-num-seqs or --max-num-batched-tokens")
    return TpuPlan(tq=tq, pages_per_block=pages, vmem_estimate_bytes=estimate(tq, pages), vmem_limit_bytes=limit,
                   smem_bytes=smem, chip=chip.name)
