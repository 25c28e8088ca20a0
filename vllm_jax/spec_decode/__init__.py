"""Speculative decoding's proposers (pure numpy, no jax): the n-gram proposer so far; the engine does not use it
yet (docs/architecture/01-overview.md, "Layout")."""
