"""Logging for the entry points: vllm_jax's own INFO lines, every other library at WARNING.

Called by the CLI and by `LLM(...)`, never on import. Other libraries stay at WARNING because their INFO lines
read as failures to a new user (jax's "Unable to initialize backend 'tpu'" on every CPU start). As in vLLM,
`VLLM_CONFIGURE_LOGGING=0` leaves logging alone and `VLLM_LOGGING_LEVEL` sets vllm_jax's level.
"""

from __future__ import annotations

import logging
import os

FORMAT = "%(levelname)s %(name)s: %(message)s"


def configure_logging(*, root: bool = False) -> None:
    """vllm_jax's logger at INFO with a stderr handler unless logging is already set up.

    `root=True` (the CLI, which owns the process) also gives the root logger a WARNING-level handler, so uvicorn's
    lines and other libraries' warnings share one format."""
    if os.environ.get("VLLM_CONFIGURE_LOGGING", "1") == "0":
        return
    level = os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper()
    if root:
        logging.basicConfig(level=logging.WARNING, format=FORMAT)
    own = logging.getLogger("vllm_jax")
    if own.level == logging.NOTSET:
        own.setLevel(level)
    if not own.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(FORMAT))
        own.addHandler(handler)
