"""Multi-LoRA serving, host side (docs/architecture/11-lora.md, "LoRA adapters"): the request type, PEFT adapter loading
into host arrays, the host cache of loaded adapters and the device-slot manager. Pure Python and numpy, no jax: the
scheduler manages the slots; `lora/device/` writes them on the device (lora/device/slots.py)."""

from vllm_jax.lora.request import LoRARequest

__all__ = ["LoRARequest"]
