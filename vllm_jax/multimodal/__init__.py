"""Images in prompts: which models read them, and turning images into what the engine's model consumes."""
