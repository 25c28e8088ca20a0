"""Pure JAX architectures, no I/O: shared layers (`layers`), one module per family (`decoder`, `moe`), their
specs read from transformers configs, and the registry by HF `architectures` name."""
