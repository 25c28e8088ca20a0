"""Ahead-of-time compile checks for chips this host does not have (TPU v5e/v6e, H100/A100/H200)."""
