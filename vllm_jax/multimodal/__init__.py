"""Images in prompts: loading them and chat content parts (docs/serving.md, "Images"), which models read them,
and turning images into what the engine's model consumes. The host side is
importable without jax; `multimodal/device/` holds the vision encoder's step."""
