"""`kvsize check-serve`: a running server's speed, as a load generator measured it, against kvsize's figures."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from app.options import _add_scenario_options, _positive_int, scenario_from_args

MAX_API_SERVERS = 64


def _api_servers(text: str) -> int:
    value = _positive_int(text)
    if value > MAX_API_SERVERS:
        raise argparse.ArgumentTypeError(f"at most {MAX_API_SERVERS} API server processes, got {text!r}")
    return value


def add_parser(sub) -> None:
    p = sub.add_parser("check-serve", help="a load generator's result against kvsize's speed figures for that server")
    p.add_argument("result", help="the JSON `vllm bench serve --save-result` wrote (.json or .json.gz)")
    _add_scenario_options(p)
    p.add_argument("--kv-cache-dtype", default="auto", help="the server's --kv-cache-dtype (default auto)")
    p.add_argument("--api-server-count", type=_api_servers, default=1,
                   help="the server's --api-server-count: the processes that stream its tokens (default 1, vLLM's)")
    p.add_argument("--requests-before", type=_positive_int, default=None, metavar="N",
                   help="the most requests the server had in flight at once before this run (1 for a server just "
                        "started: the load generator's one-prompt test); a step with prompt chunks of more requests "
                        "than ever before holds the last step's output back (docs/formulas.md). Default: a server "
                        "that has run every count")
    p.add_argument("--format", choices=["table", "json"], default="table", help="output form (default table)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from sizing.evidence.bench import MAX_BENCH_BYTES, read_bench
    from sizing.evidence.serving import held_to, served_figures
    from sizing.inputs import read_limited
    from sizing.planners.serving import HOST_SPREAD, serving_replica, simulate
    from sizing.profiles import gpu_profile, measured_efficiency

    data = read_limited(Path(args.result), MAX_BENCH_BYTES, "RESULT", "a `vllm bench serve --save-result` JSON file")
    bench = read_bench(data, args.result)
    scenario = scenario_from_args(args, args.model, args.gpu, args.engine, args.tensor_parallel_size,
                                  args.max_model_len, args.kv_cache_dtype, args.kv_cache_dtype)
    gpu = gpu_profile(args.gpu)
    model, engine = serving_replica(scenario, gpu.hbm_bandwidth_gb_s, gpu.bf16_dense_tflops, gpu.multiprocessors,
                                    measured_efficiency(),
                                    api_servers=args.api_server_count)
    load = replace(bench.load, server_seen_requests=args.requests_before)
    served = simulate(model, engine, load)
    rows = held_to(bench.measured, served_figures(served))
    loop = (f"closed loop of {load.concurrency}" if load.concurrency is not None
            else f"open loop at {load.request_rate:g} requests/s "
            + ("(its own send times replayed)" if load.sent_at else "(Poisson, seeded)"))
    within = sum(r["within"] for r in rows)
    if args.format == "json":
        print(json.dumps(dict(schema="kvsize.check-serve/1", model=scenario.model_name, gpu=scenario.gpu_name,
                              engine=scenario.engine, kv_cache_dtype=args.kv_cache_dtype,
                              api_server_count=args.api_server_count, requests_before=args.requests_before,
                              load=dict(input_tokens=load.input_tokens, output_tokens=load.output_tokens,
                                        prompts=load.num_prompts, concurrency=load.concurrency,
                                        request_rate=load.request_rate),
                              pool=dict(blocks=engine.num_blocks, block_size=engine.block_size),
                              preemptions_simulated=served.preemptions,
                              host_paced_share=round(served.host_paced_share, 4),
                              tokens_per_chunk=(round(bench.tokens_per_chunk, 3)
                                                if bench.tokens_per_chunk is not None else None),
                              rows=rows, within=within),
                         indent=2))
    else:
        print(f"{scenario.model_name} on {scenario.gpu_name}, {scenario.engine}, KV {args.kv_cache_dtype}, "
              f"{args.api_server_count} API server{'s' if args.api_server_count > 1 else ''}: {loop}, "
              f"{load.num_prompts} prompts of {load.input_tokens:,} tokens in and {load.output_tokens:,} out; "
              f"kvsize's pool {engine.num_blocks:,} blocks of {engine.block_size}; the server "
              + ("had run every count before" if args.requests_before is None
                 else f"had run at most {args.requests_before:,} requests at once before"))
        print(f"  {'figure':<22}{'measured':>12}{'kvsize':>12}{'error':>9}  bar")
        for r in rows:
            error = f"{r['error']:+.1%}" if r["error"] is not None else "-"
            print(f"  {r['figure']:<22}{r['measured']:>12,.1f}{r['kvsize']:>12,.1f}{error:>9}  "
                  f"±{r['bar']:.0%} {'met' if r['within'] else 'missed'}")
        print(f"kvsize's serving simulation is within its bars on {within} of {len(rows)} figures "
              "(docs/formulas.md, 'Serving simulation'; docs/speed-accuracy.md)")
        if served.host_paced:
            print(f"  note: the host sets {served.host_paced_share:.0%} of the simulated step time (the engine core's "
                  f"work on each stream, the API server's streaming): kvsize's terms are one host's, and "
                  f"{HOST_SPREAD}, so a miss here may be your host's CPUs")
        if bench.chunks_joined:
            print(f"  note: a streamed chunk carried {bench.tokens_per_chunk:.2f} tokens on average (the API server "
                  "joined tokens it fell behind on): the load generator times its ITL per chunk, so the measured ITL "
                  "is the API server's pace, not the engine's step, which kvsize's ITL is")
    return 0 if within == len(rows) else 1  # a figure outside its bar is a check not met, as verify's
