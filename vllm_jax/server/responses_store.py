"""The Responses API's store: responses kept in memory, bounded, oldest-used evicted first
(docs/architecture/01-overview.md, "The Responses API").

vLLM keeps stored responses in an unbounded dict behind VLLM_ENABLE_RESPONSES_API_STORE (off by default); here the
store is on by default, as `store: true` is OpenAI's default, and bounded by --responses-store-size (an LRU: a
continued conversation keeps its turns alive). Each entry holds the response object and the conversation's items
(the earlier turns, this turn's input and output), which a later `previous_response_id` puts before its own input.
A response is stored when it starts (status in_progress), so that it can be retrieved and cancelled while it runs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from vllm_jax.server.protocol_responses import ResponseObject

DEFAULT_RESPONSES_STORE_SIZE = 1024


@dataclass
class StoredResponse:
    response: ResponseObject
    items: list[dict[str, Any]] = field(default_factory=list)  # the conversation so far, as input items
    cancel: Callable[[], Awaitable[None]] | None = None  # aborts the engine request while it runs


class ResponsesStore:
    def __init__(self, max_size: int = DEFAULT_RESPONSES_STORE_SIZE):
        if max_size < 1:
            raise ValueError(f"the responses store size must be >= 1; got {max_size}")
        self.max_size = max_size
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, entry: StoredResponse) -> None:
        self._entries[entry.response.id] = entry
        self._entries.move_to_end(entry.response.id)
        while len(self._entries) > self.max_size:
            self._entries.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        return self._entries.pop(response_id, None) is not None
