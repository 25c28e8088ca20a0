"""The `vllm-jax` subcommands a vLLM user types besides `serve`: one module per command (run_batch.py, chat.py,
collect_env.py, bench/), each with `register(sub, formatter)` adding its parser and a `run(namespace)` that
cli.py dispatches to. Modules import the engine and the server lazily, inside `run`, so `vllm-jax --help` and
the client-side commands (chat, bench serve) start fast."""
