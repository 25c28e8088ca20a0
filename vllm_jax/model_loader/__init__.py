"""Checkpoint -> sharded params at start-up: model source resolution (`source`), one `WeightLoader` per format
(`weight_loader`), GGUF reading (`gguf_file`; each family's weight map and GGUF names are its entry's,
vllm_jax/models/) and tokenizer loading."""
