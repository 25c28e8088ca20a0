"""`--structured-outputs-config`: the server-wide defaults every constrained request starts from."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from vllm_jax.utils import json_object_flag


@dataclass(frozen=True)
class StructuredOutputsConfig:
    """vLLM's `--structured-outputs-config`: server-wide defaults for every constrained request (a request's own
    options can only add to them). llguidance compiles every grammar; `backend` picks how a JSON schema is read:
    "auto" (vLLM's default) as vLLM's default backend, xgrammar, reads it (an object listing its properties gets no
    others), "guidance" as vLLM's guidance backend does (other properties allowed unless
    disable_additional_properties) (docs/architecture/08-sampling.md, "Structured outputs")."""

    backend: str = "auto"
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False

    @property
    def closes_objects(self) -> bool:
        """Whether object schemas that list properties allow no others."""
        return self.disable_additional_properties or self.backend == "auto"

    @classmethod
    def parse(cls, value: str | dict | None) -> StructuredOutputsConfig:
        """From the flag's JSON text or a dict; a ValueError naming the flag and the bad key."""
        if value is None:
            return cls()
        value = json_object_flag("structured_outputs_config", value, {f.name for f in dataclasses.fields(cls)})
        backend = value.get("backend", "auto")
        if backend not in ("auto", "guidance"):
            raise ValueError(f"structured_outputs_config.backend {backend!r} is not available: this engine compiles "
                             "grammars with llguidance ('auto' reads JSON schemas as vLLM's default backend does, "
                             "'guidance' as its guidance backend does)")
        for key in ("disable_any_whitespace", "disable_additional_properties"):
            if not isinstance(value.get(key, False), bool):
                raise ValueError(f"structured_outputs_config.{key} must be true or false; got {value[key]!r}")
        return cls(backend=backend, disable_any_whitespace=value.get("disable_any_whitespace", False),
                   disable_additional_properties=value.get("disable_additional_properties", False))
