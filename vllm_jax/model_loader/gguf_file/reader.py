"""Opening a GGUF file once for its config, tokenizer and tensors, and finding its family's entry."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache, wraps
from typing import Any, ParamSpec, TypeVar

from vllm_jax.model_loader.errors import ModelSourceError
from vllm_jax.models.gguf_family import GgufArch, GgufError, field
from vllm_jax.models.registry import GGUF_ARCHS

P = ParamSpec("P")
R = TypeVar("R")


def open_gguf(path: str) -> Any:
    """The file's `gguf.GGUFReader`, shared by every reader of the same unchanged file."""
    path = os.path.realpath(os.path.expanduser(str(path)))
    if not os.path.isfile(path):
        raise ModelSourceError(f"{path}: no such GGUF file")
    stat = os.stat(path)
    return _open_reader(path, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=2)
def _open_reader(path: str, _mtime_ns: int, _size: int) -> Any:
    """Parsing the metadata costs seconds on a real vocabulary; config, tokenizer and weights share one parse."""
    import gguf

    try:
        return gguf.GGUFReader(path)
    except Exception as exc:  # bad magic, truncated header or data, unknown value type, ...
        raise ModelSourceError(f"{path}: not a GGUF file, or a truncated or corrupt one "
                               f"({type(exc).__name__}: {exc})") from exc


def architecture(reader: Any) -> GgufArch:
    """The registered family entry of the file's `general.architecture` (models/registry.py)."""
    name = field(reader, "general.architecture")
    if name not in GGUF_ARCHS:
        raise ModelSourceError(f"{reader.data.filename}: GGUF architecture {name!r} is not supported "
                               f"(supported: {', '.join(GGUF_ARCHS)})")
    return GGUF_ARCHS[name]


@contextmanager
def source_errors() -> Iterator[None]:
    """A family hook's GgufError (models/gguf_family.py) as this package's ModelSourceError."""
    try:
        yield
    except GgufError as exc:
        raise ModelSourceError(str(exc)) from exc


def reports_source_errors(function: Callable[P, R]) -> Callable[P, R]:
    """`function` with a family hook's GgufError raised as a ModelSourceError."""

    @wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with source_errors():
            return function(*args, **kwargs)

    return wrapper
