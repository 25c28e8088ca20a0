"""Speculative decoding's device side: the programs of a draft model or an EAGLE-3 head, built on the worker's
program base (worker/programs.py) and driven by the runner through `proposals`."""
