"""The request fields that constrain the output: vLLM's `structured_outputs` and OpenAI's `response_format`, each
turned into the engine's StructuredOutputsParams (docs/architecture/08-sampling.md, "Structured outputs")."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from vllm_jax.sampling_params import StructuredOutputsParams
from vllm_jax.server.openai_base import OpenAIRequestModel


class StructuredOutputsRequest(OpenAIRequestModel):
    """vLLM's `structured_outputs` request field: exactly one constraint, plus its JSON options."""

    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)

    json_schema: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None

    def to_params(self) -> StructuredOutputsParams:
        return StructuredOutputsParams(
            json=self.json_schema, regex=self.regex, choice=self.choice, grammar=self.grammar,
            json_object=self.json_object, structural_tag=self.structural_tag,
            disable_any_whitespace=self.disable_any_whitespace,
            disable_additional_properties=self.disable_additional_properties,
            whitespace_pattern=self.whitespace_pattern)


class JsonSchemaFormat(OpenAIRequestModel):
    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)

    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(OpenAIRequestModel):
    """OpenAI's response_format: text (no constraint), json_object (any JSON object) or json_schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def to_params(self) -> StructuredOutputsParams | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return StructuredOutputsParams(json_object=True)
        if self.json_schema is None or self.json_schema.schema_ is None:
            raise ValueError("response_format of type json_schema needs json_schema.schema (the JSON schema).")
        return StructuredOutputsParams(json=self.json_schema.schema_)
