"""Test-wide settings: never touch the network, run on CPU in float32."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
