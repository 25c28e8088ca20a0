"""The model families, one package each, every one declaring itself in one `ModelFamily` entry (family.py) that
registry.py collects (docs/architecture/16-family-unit.md). The shared building blocks stay in vllm_jax/model/."""
