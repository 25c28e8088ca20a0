"""The `vllm-jax` commands, one module each (serve.py, generate.py, convert.py, compile_check.py, run_batch.py,
chat.py for chat and complete, collect_env.py, and the bench/ package), each with `register(sub, formatter)`
adding its parser and the function it runs, which cli.py dispatches to (docs/cli.md). They import the engine
and the server lazily, inside the function they run, so `vllm-jax --help` and the client-side commands (chat,
bench serve) start fast."""
