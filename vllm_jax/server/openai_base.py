"""The base of every request and response model: OpenAI's bodies ignore unknown fields, requests type strictly."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="ignore")


class OpenAIRequestModel(OpenAIBaseModel):
    """Request bodies: unknown fields ignored, known ones strictly typed (no "10" for 10, no 1 for true)."""

    model_config = ConfigDict(extra="ignore", strict=True)


def is_valid_unicode(text: str) -> bool:
    """False for strings with lone surrogates (JSON can spell them, UTF-8 cannot encode them)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
