"""`vllm-jax bench serve | latency | throughput | startup | sweep`: vLLM's benchmark commands, with its flag names
and result keys. serve.py loads a running server over HTTP (any OpenAI-compatible one); latency.py and
throughput.py time the offline engine (LLM); startup.py times a cold and a warm engine start; sweep.py runs
`bench serve` over loads and plots the results. datasets.py makes the prompts, metrics.py the numbers."""

from __future__ import annotations

import argparse

from vllm_jax.commands.bench import latency, serve, startup, sweep, throughput


def register(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    bench = sub.add_parser("bench", help="benchmarks: serve, latency, throughput, startup, sweep (vLLM's bench)",
                           description="vLLM's benchmark commands.", formatter_class=formatter)
    kinds = bench.add_subparsers(dest="bench_command", required=True, metavar="BENCHMARK",
                                 help="serve, latency, throughput, startup or sweep")
    srv = kinds.add_parser("serve", help="load-test a running OpenAI-compatible server", formatter_class=formatter,
                           description="Send a dataset's requests to a running server at a request rate or a "
                           "concurrency and report throughput, TTFT, TPOT, ITL and E2E latency under vLLM's keys.")
    serve.add_serve_args(srv)
    srv.set_defaults(func=serve.run)
    for name, module, text in (
            ("latency", latency, "time one batch end to end on the offline engine"),
            ("throughput", throughput, "time a whole dataset on the offline engine"),
            ("startup", startup, "time the offline engine's cold and warm start"),
            ("sweep", sweep, "bench serve over request rates or concurrencies, with a plot")):
        parser = kinds.add_parser(name, help=text, description=module.__doc__, formatter_class=formatter)
        module.add_args(parser)
        parser.set_defaults(func=module.run)
