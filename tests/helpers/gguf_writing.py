"""Writing GGUF files the way llama.cpp's converter does, shared by the GGUF tests."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np


def add_tensor(writer: gguf.GGUFWriter, name: str, array: np.ndarray, quant: str | None = None) -> None:
    """`array` as float32, or quantized to the ggml type named `quant` (e.g. "Q8_0") by gguf-py."""
    if quant is None:
        writer.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))
    else:
        qtype = gguf.GGMLQuantizationType[quant]
        writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)


def finish_gguf(writer: gguf.GGUFWriter, path: Path) -> Path:
    """Header, metadata and tensors written, the file closed; -> path."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
