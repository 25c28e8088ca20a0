"""Which tier each test belongs to (tests/conftest.py marks every collected test with one; registered in
pyproject.toml). `python -m pytest -m unit` runs the fast tier; the README's command runs them all.

- unit: no engine, no model forward: seconds a module (the kernel-vs-oracle and the statistical sampling tests,
  tens of seconds each, are `engine`).
- engine: builds models, runners or engines in-process on one device (transformers parity, the engine's features).
- multidevice: tensor / expert / data parallelism on the session's 8 fake CPU devices, or two jax processes.
- served: a live server (in-process or a subprocess), the CLI, the package's install, the benchmarks' scripts.

A module not listed is `engine`; a test listed in MULTIDEVICE_TESTS takes that tier over its module's."""

from __future__ import annotations

UNIT_MODULES = frozenset({
    "test_block_pool", "test_config", "test_detokenizer", "test_docs", "test_harmony", "test_image_inputs",
    "test_imports",
    "test_input_batch", "test_kv_cache_manager", "test_model_layers", "test_ngram_proposer", "test_output_processor",
    "test_pooling_config", "test_reasoning", "test_responses_items", "test_rope_yarn", "test_sampler",
    "test_sampling_params", "test_scheduler", "test_spec_decode_metrics", "test_step_payload", "test_tool_choice",
    "test_tool_parsers", "test_tiers", "test_multimodal_units", "test_vs_llamacpp", "test_native_kernels",
})

MULTIDEVICE_MODULES = frozenset({"test_kernel_sharding", "test_lora_moe_tp", "test_lora_tp", "test_sharding",
                                 "test_spec_decode_multihost"})

SERVED_MODULES = frozenset({
    "test_api_fuzz", "test_bad_input", "test_benchmarks", "test_cli", "test_compilation_cache",
    "test_default_model", "test_dev_routes", "test_faults", "test_harmony_served", "test_lora_server",
    "test_mixed_soak", "test_package",
    "test_pooling_server",
    "test_responses_api", "test_security",
    "test_server",
    "test_soak", "test_structured_outputs", "test_tool_calling", "test_vision_server",
})

# (module, test function) pairs in engine modules whose check runs on several devices
MULTIDEVICE_TESTS = frozenset({
    ("test_aot_engine", "test_tensor_parallel_programs_alias_each_devices_shard"),
    ("test_deepseek", "test_tp2_with_expert_parallel_equals_tp1_with_replicated_latent_cache"),
    ("test_families", "test_tp2_logits_equal_tp1"),
    ("test_gemma", "test_tp2_greedy_tokens_equal_transformers_on_fake_devices"),
    ("test_gemma4", "test_tp2_greedy_tokens_equal_transformers_on_fake_devices"),
    ("test_gemma4_moe", "test_tp2_and_expert_parallel_greedy_tokens_equal_transformers_on_fake_devices"),
    ("test_gguf_quantized", "test_tp2_equals_tp1_kept_q4_1"),
    ("test_moe", "test_expert_parallel_ffn_on_four_devices_equals_single_device"),
    ("test_pooling", "test_tp2_embeddings_equal_tp1"),
    ("test_prequantized_checkpoints", "test_tp2_equals_tp1_for_block_fp8"),
    ("test_quantization", "test_tp2_equals_tp1_for_int8"),
    ("test_spec_decode_eagle3", "test_tp2_proposes_and_generates_as_tp1"),
    ("test_qwen2_5_vl_engine", "test_tp2_equals_tp1"),
    ("test_qwen3_vl", "test_tp2_equals_tp1"),
    ("test_weight_sync", "test_tensor_parallel_update_equals_a_fresh_tp2_engine"),
    ("test_weight_sync", "test_update_equals_a_fresh_load"),
    ("test_weight_sync_gguf", "test_tensor_parallel_kept_update_equals_a_fresh_load"),
})

TIERS = ("unit", "engine", "multidevice", "served")


def tier_of(module: str, function: str) -> str:
    """The tier of test `function` in tests/`module`.py."""
    if (module, function) in MULTIDEVICE_TESTS or module in MULTIDEVICE_MODULES:
        return "multidevice"
    if module in UNIT_MODULES:
        return "unit"
    if module in SERVED_MODULES:
        return "served"
    return "engine"
