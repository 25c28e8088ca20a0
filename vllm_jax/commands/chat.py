"""`vllm-jax chat` and `vllm-jax complete`: talk to a running OpenAI-compatible server, as vLLM's commands do.

Both go through the openai client (so they work against any such server), stream the answer as it comes, take
the first model the server lists unless `--model-name` names one, and answer once with `--quick TEXT` (the smoke
test). Otherwise they read prompts from the terminal until EOF (Ctrl-D); chat keeps the whole conversation as
history, complete sends each prompt on its own.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from typing import Any

DEFAULT_URL = "http://localhost:8000/v1"


def _client(ns: argparse.Namespace) -> tuple[Any, str]:
    """The client and the model name to send (the server's first listed model by default)."""
    import openai

    api_key = ns.api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
    client = openai.OpenAI(base_url=ns.url, api_key=api_key)
    model = ns.model_name or client.models.list().data[0].id
    return client, model


def _print_stream(chunks: Any, text_of: Any) -> str:
    """Print each chunk's text as it arrives; the whole text."""
    parts = []
    for chunk in chunks:
        if not chunk.choices:
            continue
        piece = text_of(chunk.choices[0]) or ""
        parts.append(piece)
        print(piece, end="", flush=True)
    print()
    return "".join(parts)


def _prompts(ns: argparse.Namespace) -> Any:
    """The --quick text alone, or the terminal's lines until EOF / Ctrl-C."""
    if ns.quick is not None:
        yield ns.quick
        return
    with contextlib.suppress(ImportError):
        import readline  # noqa: F401 - line editing and recall for input()
    while True:
        try:
            yield input("> ")
        except (EOFError, KeyboardInterrupt):
            print()
            return


def run_chat(ns: argparse.Namespace) -> int:
    client, model = _client(ns)
    messages: list[dict[str, str]] = [{"role": "system", "content": ns.system_prompt}] if ns.system_prompt else []
    if ns.quick is None:
        print(f"Using model: {model} (Ctrl-D to end)")
    for text in _prompts(ns):
        messages.append({"role": "user", "content": text})
        stream = client.chat.completions.create(model=model, messages=messages, stream=True,
                                                max_tokens=ns.max_tokens)
        answer = _print_stream(stream, lambda choice: choice.delta.content)
        messages.append({"role": "assistant", "content": answer})
    return 0


def run_complete(ns: argparse.Namespace) -> int:
    client, model = _client(ns)
    if ns.quick is None:
        print(f"Using model: {model} (Ctrl-D to end)")
    for text in _prompts(ns):
        stream = client.completions.create(model=model, prompt=text, stream=True, max_tokens=ns.max_tokens)
        _print_stream(stream, lambda choice: choice.text)
    return 0


def _add_client_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=DEFAULT_URL, help="the server's OpenAI base URL")
    parser.add_argument("--model-name", default=None, help="the model to ask (default: the first one the server "
                        "lists)")
    parser.add_argument("--api-key", default=None, help="the server's API key (default: $OPENAI_API_KEY, else "
                        "none)")
    parser.add_argument("--max-tokens", type=int, default=None, help="most tokens per answer (default: the "
                        "server's)")
    parser.add_argument("-q", "--quick", default=None, metavar="TEXT", help="send TEXT once, print the answer "
                        "and exit")


def register(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    chat = sub.add_parser("chat", help="chat with a running server (vLLM's chat)", formatter_class=formatter,
                          description="Chat with a model behind an OpenAI-compatible server; the conversation is "
                          "kept as history until EOF.")
    _add_client_args(chat)
    chat.add_argument("--system-prompt", default=None, help="a system message that opens the conversation")
    chat.set_defaults(func=run_chat)
    complete = sub.add_parser("complete", help="complete prompts with a running server (vLLM's complete)",
                              formatter_class=formatter, description="Complete each prompt with a model behind an "
                              "OpenAI-compatible server (/v1/completions; no history).")
    _add_client_args(complete)
    complete.set_defaults(func=run_complete)
