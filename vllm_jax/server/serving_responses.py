"""/v1/responses: OpenAI's Responses API on the chat pipeline (docs/architecture/01-overview.md, "The Responses
API").

The request becomes a chat completions request (protocol_responses.py), which `prepare_chat` renders, checks and
turns into sampling params and output rules exactly as /v1/chat/completions does; the engine's text is read by the
same ChatOutputRules (reasoning parser, tool choice, tool parser) and only then shaped into Responses output
items: a reasoning item, a message with its output_text, function_call items. Streaming sends OpenAI's typed
events (`event: <type>` + `data: {..., "sequence_number": n}`), one output item at a time; a client that hangs up
aborts the engine request, as on chat. The store (responses_store.py) keeps responses for GET / DELETE / cancel
and for `previous_response_id`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from vllm_jax.server.chat_output import ChatOutputRules, ChoiceStreamer
from vllm_jax.server.engine_streams import RequestStreams, await_or_disconnect, start_or_abort
from vllm_jax.server.errors import APIError, bad_request
from vllm_jax.server.protocol_responses import (
    FunctionCallItem,
    IncompleteDetails,
    OutputItem,
    OutputMessage,
    OutputText,
    ReasoningItem,
    ReasoningText,
    ResponseObject,
    ResponsesInputError,
    ResponsesRequest,
    ResponseUsage,
    output_as_input,
)
from vllm_jax.server.responses import AssistantMessage, DeltaToolCall
from vllm_jax.server.responses_store import ResponsesStore, StoredResponse
from vllm_jax.server.serving import ServingContext
from vllm_jax.server.serving_chat import PreparedChat, final_output, prepare_chat
from vllm_jax.server.sse import SSEResponse, stream_error_event

# chat's field names in errors raised by the shared pipeline, and the Responses field each one came from
_CHAT_PARAMS = {"messages": "input", "max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens",
                "response_format": "text.format"}


def _responses_param(param: str | None) -> str | None:
    """The Responses field a chat error's `param` came from (a content part's place, messages[1].content[0]...,
    is in `input`)."""
    if param is not None and param.startswith("messages["):
        return "input"
    return _CHAT_PARAMS.get(param or "", param)


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def not_found(response_id: str) -> APIError:
    return APIError(404, f"Response with id {response_id!r} not found.", param="response_id",
                    code="response_not_found")


class ResponsesServing:
    """The /v1/responses routes' logic; `store` None is --disable-responses-store."""

    def __init__(self, ctx: ServingContext, store: ResponsesStore | None):
        self.ctx, self.store = ctx, store

    # ---- create ----
    async def create(self, body: ResponsesRequest, raw: Request) -> Response:
        history = self._history(body.previous_response_id)
        try:
            chat_body = body.to_chat_request(history)
        except ResponsesInputError as exc:
            raise bad_request(str(exc), param=exc.param) from exc
        try:
            chat = await prepare_chat(self.ctx, chat_body)
        except APIError as err:
            err.param = _responses_param(err.param)
            raise
        response_id = _item_id("resp")
        response = ResponseObject.for_request(response_id, chat.model, body)
        response.store = body.store and self.store is not None
        items = history + body.input_items()
        self.ctx.log_request(response_id, chat.conversation, chat.params)
        streams = RequestStreams(self.ctx.engine, [chat.engine_prompt], [chat.params], [response_id],
                                 priority=chat_body.priority, cache_salt=chat_body.cache_salt,
                                 lora_request=self.ctx.lora_request(chat_body.model))
        entry = StoredResponse(response, items, cancel=lambda: self.ctx.engine.abort(response_id))
        if response.store and self.store is not None:
            self.store.put(entry)
        if body.stream:
            try:
                await start_or_abort(streams, raw)
            except BaseException:
                self._forget(response_id)
                raise
            return SSEResponse(self._stream(entry, chat, streams), on_close=streams.close)
        try:
            final = await await_or_disconnect(final_output(streams), raw)
        except BaseException:
            self._forget(response_id)
            raise
        finally:
            await streams.close()
        out = final.outputs[0]
        message, _ = chat.rules.message(out.text, out.finish_reason)
        output = _output_items(message, out.finish_reason)
        self._finish(entry, output, out.finish_reason, len(chat.prompt_ids), len(out.token_ids), message.reasoning)
        return JSONResponse(entry.response.model_dump())

    def _history(self, previous_response_id: str | None) -> list[dict[str, Any]]:
        if previous_response_id is None:
            return []
        if self.store is None:
            raise bad_request("previous_response_id needs the response store, which this server runs without "
                              "(--disable-responses-store).", param="previous_response_id")
        entry = self.store.get(previous_response_id)
        if entry is None:
            raise not_found(previous_response_id)
        if entry.response.status == "in_progress":
            raise bad_request(f"Response {previous_response_id!r} is still in progress.",
                              param="previous_response_id")
        return list(entry.items)

    def _forget(self, response_id: str) -> None:
        if self.store is not None:
            self.store.delete(response_id)

    def _finish(self, entry: StoredResponse, output: list[OutputItem], finish_reason: str | None,
                input_tokens: int, output_tokens: int, reasoning: str | None) -> None:
        """Settle the response (status, output, usage) and the conversation a later turn continues."""
        response = entry.response
        response.output = output
        # a cancelled response stays cancelled, even if the engine finished before the abort reached it
        response.status, reason = ("cancelled", None) if response.status == "cancelled" else _status(finish_reason)
        response.incomplete_details = IncompleteDetails(reason=reason) if reason else None
        reasoning_tokens = min(output_tokens, len(self.ctx.engine.tokenizer.encode(reasoning, add_special_tokens=False))
                               if reasoning else 0)
        response.usage = ResponseUsage(input_tokens=input_tokens, output_tokens=output_tokens,
                                       total_tokens=input_tokens + output_tokens,
                                       output_tokens_details={"reasoning_tokens": reasoning_tokens})
        entry.items = entry.items + output_as_input(output)
        entry.cancel = None

    # ---- stream ----
    async def _stream(self, entry: StoredResponse, chat: PreparedChat, streams: RequestStreams) -> AsyncIterator[str]:
        events = _Events()
        response = entry.response
        writer = _OutputWriter(events, chat.rules)
        output_tokens, finish_reason, reasoning = 0, None, ""
        try:
            yield events("response.created", response=response.model_dump())
            yield events("response.in_progress", response=response.model_dump())
            async for _, request_output in streams:
                out = request_output.outputs[0]
                output_tokens += len(out.token_ids)
                finish_reason = out.finish_reason
                for event in writer.push(out.text, finished=finish_reason is not None):
                    yield event
                reasoning += writer.last_reasoning
            for event in writer.close(incomplete=finish_reason == "length"):
                yield event
            self._finish(entry, writer.items, finish_reason, len(chat.prompt_ids), output_tokens, reasoning)
            kind = "response.completed" if response.status == "completed" else "response.incomplete"
            yield events(kind, response=response.model_dump())
        except Exception as exc:  # noqa: BLE001 - the status line is sent: report in-band
            body = json.loads(stream_error_event(exc, response.id)[len("data: "):])["error"]
            response.status = "failed"
            yield events("error", code=body.get("code"), message=body["message"], param=body.get("param"))
        finally:
            if response.status == "in_progress":  # the client hung up: the engine request was aborted
                response.status = "cancelled"
                entry.cancel = None
            await streams.close()

    # ---- retrieve / delete / cancel ----
    def _entry(self, response_id: str) -> StoredResponse:
        entry = self.store.get(response_id) if self.store is not None else None
        if entry is None:
            raise not_found(response_id)
        return entry

    def retrieve(self, response_id: str) -> dict[str, Any]:
        return self._entry(response_id).response.model_dump()

    def delete(self, response_id: str) -> dict[str, Any]:
        self._entry(response_id)
        assert self.store is not None
        self.store.delete(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    async def cancel(self, response_id: str) -> dict[str, Any]:
        """Abort a response still in progress (its request answers with status cancelled); 400 for one that
        has ended."""
        entry = self._entry(response_id)
        if entry.response.status != "in_progress" or entry.cancel is None:
            raise bad_request(f"Response {response_id!r} is {entry.response.status}; only a response in progress "
                              "can be cancelled.", param="response_id")
        cancel, entry.cancel = entry.cancel, None
        await cancel()
        entry.response.status = "cancelled"
        return entry.response.model_dump()


def _status(finish_reason: str | None) -> tuple[str, str | None]:
    """The response status and incomplete_details.reason for the engine's finish reason."""
    if finish_reason == "length":
        return "incomplete", "max_output_tokens"
    if finish_reason == "abort":
        return "cancelled", None
    return "completed", None


def _output_items(message: AssistantMessage, finish_reason: str | None) -> list[OutputItem]:
    status = "incomplete" if finish_reason == "length" else "completed"
    items: list[OutputItem] = []
    if message.reasoning:
        items.append(ReasoningItem(id=_item_id("rs"), content=[ReasoningText(text=message.reasoning)]))
    if message.content:
        items.append(OutputMessage(id=_item_id("msg"), status=status, content=[OutputText(text=message.content)]))
    items.extend(FunctionCallItem(id=_item_id("fc"), call_id=call.id, name=call.function.name,
                                  arguments=call.function.arguments) for call in message.tool_calls)
    return items


class _Events:
    """OpenAI's SSE framing for the Responses API: `event: <type>` and the JSON with its sequence_number."""

    def __init__(self) -> None:
        self.sequence_number = 0

    def __call__(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return f"event: {kind}\ndata: {json.dumps(payload)}\n\n"


class _OutputWriter:
    """Turns the chat streamer's deltas into output items, one open at a time, with their added / delta / done
    events; `items` holds the finished ones."""

    def __init__(self, events: _Events, rules: ChatOutputRules):
        self.events, self.streamer = events, ChoiceStreamer(rules)
        self.items: list[OutputItem] = []
        self._open: OutputItem | None = None
        self._text = ""
        self.last_reasoning = ""

    def push(self, text: str, finished: bool) -> list[str]:
        delta = self.streamer.push(text, finished)
        self.last_reasoning = delta.reasoning or ""
        out: list[str] = []
        if delta.reasoning:
            out += self._append(ReasoningItem, delta.reasoning)
        if delta.content:
            out += self._append(OutputMessage, delta.content)
        for piece in delta.tool_calls or []:
            out += self._call_piece(piece)
        return out

    def _location(self) -> dict[str, Any]:
        assert self._open is not None
        return {"item_id": self._open.id, "output_index": len(self.items)}

    def _append(self, kind: type[ReasoningItem] | type[OutputMessage], delta: str) -> list[str]:
        out: list[str] = []
        if not isinstance(self._open, kind):
            out += self.close()
            self._open = (ReasoningItem(id=_item_id("rs"), status="in_progress") if kind is ReasoningItem
                          else OutputMessage(id=_item_id("msg"), status="in_progress"))
            part = ReasoningText(text="") if kind is ReasoningItem else OutputText(text="")
            out.append(self.events("response.output_item.added", output_index=len(self.items),
                                   item=self._open.model_dump()))
            out.append(self.events("response.content_part.added", **self._location(), content_index=0,
                                   part=part.model_dump()))
        self._text += delta
        if kind is ReasoningItem:
            out.append(self.events("response.reasoning_text.delta", **self._location(), content_index=0, delta=delta))
        else:
            out.append(self.events("response.output_text.delta", **self._location(), content_index=0, delta=delta,
                                   logprobs=[]))
        return out

    def _call_piece(self, piece: DeltaToolCall) -> list[str]:
        out: list[str] = []
        if piece.id is not None:  # the first piece of a call: a new item
            out += self.close()
            self._open = FunctionCallItem(id=_item_id("fc"), call_id=piece.id, name=piece.function.name or "",
                                          arguments="", status="in_progress")
            out.append(self.events("response.output_item.added", output_index=len(self.items),
                                   item=self._open.model_dump()))
        if piece.function.arguments:
            self._text += piece.function.arguments
            out.append(self.events("response.function_call_arguments.delta", **self._location(),
                                   delta=piece.function.arguments))
        return out

    def close(self, incomplete: bool = False) -> list[str]:
        """Finish the open item: its done events, then output_item.done (`incomplete`: the output was cut)."""
        item, text = self._open, self._text
        if item is None:
            return []
        out: list[str] = []
        if isinstance(item, FunctionCallItem):
            item.arguments = text
            out.append(self.events("response.function_call_arguments.done", **self._location(), name=item.name,
                                   arguments=text))
        elif isinstance(item, ReasoningItem):
            item.content = [ReasoningText(text=text)]
            out.append(self.events("response.reasoning_text.done", **self._location(), content_index=0, text=text))
            out.append(self.events("response.content_part.done", **self._location(), content_index=0,
                                   part=item.content[0].model_dump()))
        else:
            item.content = [OutputText(text=text)]
            out.append(self.events("response.output_text.done", **self._location(), content_index=0, text=text,
                                   logprobs=[]))
            out.append(self.events("response.content_part.done", **self._location(), content_index=0,
                                   part=item.content[0].model_dump()))
        item.status = "incomplete" if incomplete else "completed"
        out.append(self.events("response.output_item.done", output_index=len(self.items), item=item.model_dump()))
        self.items.append(item)
        self._open, self._text = None, ""
        return out

