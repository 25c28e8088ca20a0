"""vLLM's multimodal input flags, checked once into a frozen `MultiModalConfig` (docs/serving.md, "Images").

`--limit-mm-per-prompt` bounds the items of each modality one prompt may carry (vLLM V1's default: 999 each);
`--allowed-local-media-path` is the one directory whose files `file://` URLs may name (off by default, as in vLLM);
`--allowed-media-domains` lists the hosts whose http(s) URLs the server fetches. vLLM fetches from any host when the
flag is not given; here fetching is off until it is, so a server never reaches out to the network on a client's
say-so unless its operator allowed those hosts. `--encoder-cache-size` bounds the encoder cache in image tokens (0:
vLLM's size, max(max_num_batched_tokens, one largest image); vLLM has no flag for it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_jax.utils import json_object_flag

SUPPORTED_MODALITIES = ("image",)
# vLLM's other modality names: accepted with a limit of 0 (vLLM's way to turn one off), refused otherwise
VLLM_ONLY_MODALITIES = ("video", "audio")
DEFAULT_LIMIT_PER_PROMPT = 999  # vLLM V1's default for every modality
DEFAULT_FETCH_TIMEOUT_S = 5.0  # vLLM's VLLM_IMAGE_FETCH_TIMEOUT default
FETCH_TIMEOUT_ENV = "VLLM_IMAGE_FETCH_TIMEOUT"


@dataclass(frozen=True)
class MultiModalConfig:
    """What a request's media may be: how many per prompt, and where they may come from."""

    limit_per_prompt: dict[str, int] = field(default_factory=dict)  # modality -> most items (missing: the default)
    allowed_local_media_path: str = ""  # resolved directory ("" : file:// URLs are refused)
    allowed_media_domains: tuple[str, ...] = ()  # lower-case host names (empty: http(s) URLs are refused)
    fetch_timeout_s: float = DEFAULT_FETCH_TIMEOUT_S
    encoder_cache_size: int = 0  # image tokens the encoder cache keeps (0: vLLM's size; multimodal/encoder_cache.py)

    def limit(self, modality: str) -> int:
        return self.limit_per_prompt.get(modality, DEFAULT_LIMIT_PER_PROMPT)

    @classmethod
    def create(cls, limit_mm_per_prompt: str | dict | None = None, allowed_local_media_path: str = "",
               allowed_media_domains: list[str] | tuple[str, ...] | str | None = None,
               encoder_cache_size: int = 0) -> MultiModalConfig:
        """From the flags (JSON text or a dict for the limits); a ValueError naming the bad flag."""
        if not isinstance(encoder_cache_size, int) or isinstance(encoder_cache_size, bool) or encoder_cache_size < 0:
            raise ValueError(f"encoder_cache_size must be a non-negative number of image tokens (0: the default); "
                             f"got {encoder_cache_size!r}")
        return cls(limit_per_prompt=_parse_limits(limit_mm_per_prompt),
                   allowed_local_media_path=_resolve_media_dir(allowed_local_media_path),
                   allowed_media_domains=_parse_domains(allowed_media_domains),
                   fetch_timeout_s=_fetch_timeout(), encoder_cache_size=encoder_cache_size)


def _parse_limits(value: str | dict | None) -> dict[str, int]:
    if value is None:
        return {}
    limits = json_object_flag("limit_mm_per_prompt", value)
    parsed = {}
    for modality, limit in limits.items():
        if isinstance(limit, dict):  # vLLM's newer form: {"count": N, "width": .., "height": ..} (sizes ignored)
            limit = limit.get("count", DEFAULT_LIMIT_PER_PROMPT)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise ValueError(f"limit_mm_per_prompt[{modality!r}] must be a non-negative integer; got {limit!r}")
        if modality in VLLM_ONLY_MODALITIES and limit > 0:
            raise ValueError(f"limit_mm_per_prompt: modality {modality!r} is not supported here (only "
                             f"{', '.join(SUPPORTED_MODALITIES)}); give it 0 or leave it out")
        if modality not in SUPPORTED_MODALITIES + VLLM_ONLY_MODALITIES:
            raise ValueError(f"limit_mm_per_prompt: unknown modality {modality!r}; known: "
                             f"{', '.join(SUPPORTED_MODALITIES)}")
        parsed[modality] = limit
    return parsed


def _resolve_media_dir(path: str | None) -> str:
    if not path:
        return ""
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_dir():
        raise ValueError(f"allowed_local_media_path {path!r} is not an existing directory")
    return str(resolved)


def _parse_domains(domains: Any) -> tuple[str, ...]:
    if not domains:
        return ()
    if isinstance(domains, str):
        domains = domains.split(",")
    if not all(isinstance(d, str) for d in domains):
        raise ValueError(f"allowed_media_domains must be a list of host names; got {domains!r}")
    cleaned = tuple(d.strip().lower().rstrip(".") for d in domains if d.strip())
    bad = [d for d in cleaned if "/" in d or ":" in d or " " in d]
    if bad:
        raise ValueError(f"allowed_media_domains takes host names (no scheme, port or path); got {bad}")
    return cleaned


def _fetch_timeout() -> float:
    raw = os.environ.get(FETCH_TIMEOUT_ENV)
    if raw is None:
        return DEFAULT_FETCH_TIMEOUT_S
    try:
        timeout = float(raw)
    except ValueError:
        raise ValueError(f"{FETCH_TIMEOUT_ENV} must be a number of seconds; got {raw!r}") from None
    if not timeout > 0:
        raise ValueError(f"{FETCH_TIMEOUT_ENV} must be positive; got {raw!r}")
    return timeout
