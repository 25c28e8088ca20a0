"""Ragged paged attention, MLA and the KV-cache write as plain XLA (xla_attention, xla_common, mla_attention),
Pallas TPU (Mosaic: tpu_*) and Pallas GPU (Triton: gpu_*) kernels; vllm_jax.attention picks and calls them. The
tests hold each against a numpy oracle that shares no code with them (tests/helpers/attention_oracle.py)."""
