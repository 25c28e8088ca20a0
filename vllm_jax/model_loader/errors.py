"""The loader's one error type, in a leaf module: source resolution (source.py) dispatches to the format readers
(gguf_file/, orbax_io.py), which raise it too, so it cannot live in source.py without an import circle."""

from __future__ import annotations


class ModelSourceError(ValueError):
    """The model could not be found or read; the message names the path and what is wrong."""
