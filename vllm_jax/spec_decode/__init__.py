"""Speculative decoding, one feature in one place (docs/architecture/08-sampling.md, "Speculative decoding").

The host side here is pure Python and numpy, importable without jax: the config and the n-gram proposer.
`spec_decode/device/` is the jax side: the draft model's and the EAGLE-3 head's steps, the draft chain's packing,
the proposals they make each step, the EAGLE-3 head and its loader. Verification (rejection sampling) is the
sampler's (sample/sampler.py, `verify_proposals`)."""
