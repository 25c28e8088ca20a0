"""A real engine whose outputs a test can script: `ScriptedOutputs(engine)` records every request the server sends
it (prompt ids and SamplingParams) and, while scripts are queued, answers the next request with a script instead
of the model. A tiny random model never writes tool-call syntax; a script lets an HTTP test check how the server
reads such text. What it proves is the server's side (rendering, parsing, the response and stream shapes), not
that a model writes the syntax."""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from vllm_jax.engine.async_llm import AsyncLLM
from vllm_jax.outputs import CompletionOutput, RequestOutput
from vllm_jax.sampling_params import RequestOutputKind, SamplingParams

PIECE_CHARS = 3  # a streamed script arrives in deltas of this many characters
_TOKEN = 259  # one fake token id per character (tests/helpers/tiny_models.py: 'a')


class ScriptedOutputs:
    def __init__(self, engine: AsyncLLM):
        self.requests: list[tuple[list[int], SamplingParams]] = []
        self._scripts: deque[str] = deque()
        self._model = engine.generate
        engine.generate = self._generate  # type: ignore[method-assign]  # the instance attribute wins

    def next(self, *texts: str) -> None:
        """The next requests' output texts, one request each (every choice of a request gets the same text)."""
        self._scripts.extend(texts)

    def last_prompt(self, tokenizer: Any) -> str:
        return tokenizer.decode(self.requests[-1][0])

    async def _generate(self, prompt: list[int], params: SamplingParams, request_id: str,
                        **kwargs: Any) -> AsyncIterator[RequestOutput]:
        self.requests.append((list(prompt), params))
        if not self._scripts:
            async for out in self._model(prompt, params, request_id, **kwargs):
                yield out
            return
        text = self._scripts.popleft()
        streamed = params.output_kind == RequestOutputKind.DELTA
        pieces = [text[i:i + PIECE_CHARS] for i in range(0, len(text), PIECE_CHARS)] if streamed else [text]
        pieces = pieces or [""]
        for k, piece in enumerate(pieces):
            last = k == len(pieces) - 1
            outputs = [CompletionOutput(i, piece, [_TOKEN] * len(piece), None, None, "stop" if last else None)
                       for i in range(params.n)]
            yield RequestOutput(request_id, None, list(prompt), None, outputs, finished=last)
