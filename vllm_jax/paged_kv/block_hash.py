"""Chained hashes of full KV blocks: the keys of the prefix cache.

A block's hash covers its parent's hash, its own token ids and extra keys, so equal hashes mean equal
whole prefixes, not just equal blocks. `cache_salt` and the LoRA adapter id are extra keys of the FIRST block
only; the chain carries them into every later block, so two salts (or adapters) never share a cached block.

Hashes are SHA-256 digests (bytes) over an explicit encoding: stable across processes and Python's
hash randomization, and without pickle.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

BlockHash = bytes
ExtraKey = str | int | bytes


def _encode_extra_key(key: ExtraKey) -> bytes:
    if isinstance(key, bool) or not isinstance(key, (str, int, bytes)):
        raise TypeError(f"block hash extra keys must be str, int or bytes; got {type(key).__name__}")
    if isinstance(key, str):
        data = key.encode("utf-8")
        return b"s" + struct.pack("<Q", len(data)) + data
    if isinstance(key, bytes):
        return b"b" + struct.pack("<Q", len(key)) + key
    return b"i" + struct.pack("<q", key)


def hash_block_tokens(parent_hash: BlockHash | None, token_ids: Sequence[int],
                      extra_keys: tuple[ExtraKey, ...] = ()) -> BlockHash:
    """Hash one block given its parent's hash (None for the first block)."""
    h = hashlib.sha256()
    if parent_hash is None:
        h.update(b"N")
    else:
        h.update(b"P" + struct.pack("<Q", len(parent_hash)) + parent_hash)
    h.update(b"T" + struct.pack(f"<Q{len(token_ids)}q", len(token_ids), *token_ids))
    h.update(b"E" + struct.pack("<Q", len(extra_keys)))
    for key in extra_keys:
        h.update(_encode_extra_key(key))
    return h.digest()


def block_extra_keys(block_index: int, cache_salt: str | None, lora_int_id: int = 0) -> tuple[ExtraKey, ...]:
    """Extra keys of block `block_index`: the salt and the LoRA adapter's id (a str and an int: they never
    collide) on block 0 only; the chain carries them onward, so no block is shared across salts or adapters."""
    if block_index != 0:
        return ()
    keys: tuple[ExtraKey, ...] = () if cache_salt is None else (cache_salt,)
    return keys + ((lora_int_id,) if lora_int_id else ())


def extend_block_hashes(block_hashes: list[BlockHash], token_ids: Sequence[int], block_size: int,
                        cache_salt: str | None = None, lora_int_id: int = 0,
                        mm_spans: Sequence[tuple[int, int, str]] = ()) -> list[BlockHash]:
    """Append to `block_hashes` (in place) the hashes of the full blocks of `token_ids` not hashed yet.

    Tokens are append-only, so hashes computed earlier stay valid; only new full blocks cost work.
    Returns the same list for convenience.
    """
    num_full = len(token_ids) // block_size
    for i in range(len(block_hashes), num_full):
        parent = block_hashes[i - 1] if i > 0 else None
        block = token_ids[i * block_size:(i + 1) * block_size]
        keys = block_extra_keys(i, cache_salt, lora_int_id) + _image_keys(i * block_size, block_size, mm_spans)
        block_hashes.append(hash_block_tokens(parent, block, keys))
    return block_hashes


def _image_keys(start: int, block_size: int, mm_spans: Sequence[tuple[int, int, str]]) -> tuple[ExtraKey, ...]:
    """The content hashes of the images whose placeholder tokens (offset, length, hash) overlap the block at
    `start`, as vLLM keys them: the placeholders are equal tokens for every image, the hashes tell images apart."""
    return tuple(h for offset, length, h in mm_spans if offset < start + block_size and start < offset + length)
