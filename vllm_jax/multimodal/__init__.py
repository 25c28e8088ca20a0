"""Images in prompts: loading them, chat content parts, and which models read them (docs/serving.md, "Images")."""
