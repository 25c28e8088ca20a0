"""What compiling a target's programs found: each program's report (`ProgramResult`) and the target's whole check
(`TargetResult`), filled by aot/engine_programs.py and judged by aot/checks.py."""

from __future__ import annotations

import dataclasses

from vllm_jax.aot.compile import CompileReport
from vllm_jax.worker.kv_budget import KVBudget


@dataclasses.dataclass
class ProgramResult:
    label: str  # warm-up's label, e.g. "forward T=256 S=256"
    kind: str  # "forward", "sampler" or "token" (async scheduling's token feed / record)
    num_tokens: int | None  # the forward's token bucket
    num_seqs: int
    report: CompileReport
    reused: bool = False  # compiled once, for the KV probe (kv_budget.sized_by_probes), and reused by the plan

    @property
    def decode(self) -> bool:
        """A pure-decode bucket: every row one token (the programs a serving step runs most)."""
        return self.kind == "forward" and self.num_tokens == self.num_seqs


@dataclasses.dataclass
class TargetResult:
    target: str
    platform: str = ""
    tensor_parallel_size: int = 1
    attention_backend: str = ""
    dtype: str = ""
    max_model_len: int = 0
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    block_size: int = 0
    num_layers: int = 0
    scan_layers: bool = True
    kv_cache_dtype: str = ""
    mla: bool = False  # an MLA model: its forward holds the MLA kernel (aot.checks.expected_kernels)
    budget: KVBudget | None = None
    # the target's own cache per block: what the forward aliases (a draft model's cache shares the blocks)
    target_kv_bytes_per_block: int = 0
    programs: list[ProgramResult] = dataclasses.field(default_factory=list)
    refused: str | None = None  # the config cannot run on this target: the message naming the flag
    failures: list[str] = dataclasses.field(default_factory=list)  # filled by aot.checks
    seconds: float = 0.0  # the whole check, the KV probe included
    # every compile of the check once (the KV probe's too: what the plan reuses counts once)
    compile_seconds: float = 0.0
    compile_cpu_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.refused is None and not self.failures
