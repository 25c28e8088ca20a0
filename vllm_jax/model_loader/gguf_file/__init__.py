"""Reading a GGUF file (llama.cpp's format) as a transformers config, a tokenizer and HF-named float32 weights.

A GGUF carries no config.json, no tokenizer.json and no safetensors: its metadata is the config and the
tokenizer, and its tensors use llama.cpp names, ggml shapes and (often) quantized blocks. This package turns
that back into what an HF checkpoint of the same model would give, so the rest of the engine never knows the
model came from a GGUF:

    config = read_gguf_config(path)          # the config class of the file's family (its GgufArch)
    tokenizer = load_gguf_tokenizer(path)    # PreTrainedTokenizerFast with the file's chat template
    for name, array in iter_gguf_tensors(path):   # ("model.layers.0.self_attn.q_proj.weight", float32 [out, in])
        ...

One module per product (`config`, `tokenizer`, `tensors`), over one cached parse of the file (`reader`), which
finds the file's architecture in the registry (models/registry.py GGUF_ARCHS) and follows that family's entry.
No torch anywhere: `gguf` reads with numpy.
"""

from vllm_jax.model_loader.gguf_file.config import read_gguf_config
from vllm_jax.model_loader.gguf_file.tensors import GGUFCheckpoint, iter_gguf_tensors
from vllm_jax.model_loader.gguf_file.tokenizer import load_gguf_tokenizer

__all__ = ["GGUFCheckpoint", "iter_gguf_tensors", "load_gguf_tokenizer", "read_gguf_config"]
