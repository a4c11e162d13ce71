"""Write measure/serving/plan.json: the vLLM OpenAI servers started on the GPU machine and the load points
driven against each (issue 48, 'the real engine as the judge of speed').

A server is one `vllm serve` on dummy weights with fixed settings; a point is one `vllm bench serve` run
against it at fixed input and output lengths (random tokens, ignore_eos): closed loop (`concurrency` requests
in flight, request rate inf) or open loop (Poisson arrivals at `request_rate` per second). Servers of one
batch share a GPU machine; a lane is the GPUs one server after another runs on.

usage: python scripts/serving_plan.py            (rewrites measure/serving/plan.json)
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "measure" / "serving" / "plan.json"

VLLM_VERSION = "0.33.0"
GPU = "h100-sxm"  # kvsize's GPU profile of the machine's cards (NVIDIA H100 80GB HBM3)
# The release's own defaults on an 80 GB Hopper for `vllm serve`, given explicitly so that they are recorded.
MAX_NUM_BATCHED_TOKENS = 8192
MAX_NUM_SEQS = 1024
GPU_MEMORY_UTILIZATION = 0.9


def closed(i: int, o: int, c: int, n: int) -> dict:
    return dict(input_len=i, output_len=o, concurrency=c, request_rate=None, num_prompts=n)


def opened(i: int, o: int, rate: float, n: int) -> dict:
    return dict(input_len=i, output_len=o, concurrency=None, request_rate=rate, num_prompts=n)


LLAMA_POINTS = [
    closed(1000, 256, 1, 3), closed(1000, 256, 8, 16), closed(1000, 256, 32, 64), closed(1000, 256, 128, 256),
    closed(1000, 256, 384, 576), closed(1000, 400, 16, 32),
    closed(8000, 256, 1, 3), closed(8000, 256, 8, 16), closed(8000, 256, 32, 48), closed(8000, 256, 64, 64),
    closed(32000, 128, 1, 2), closed(32000, 128, 8, 8),
    closed(64000, 128, 1, 2), closed(64000, 128, 4, 4),
    opened(1000, 256, 4, 40), opened(1000, 256, 16, 128), opened(1000, 256, 64, 256), opened(8000, 256, 1, 15),
]
MOE_POINTS = [
    closed(1000, 256, 1, 3), closed(1000, 256, 8, 16), closed(1000, 256, 32, 64), closed(1000, 256, 96, 192),
    closed(8000, 256, 1, 3), closed(8000, 256, 8, 16), closed(32000, 128, 1, 2), closed(32000, 128, 3, 3),
    opened(1000, 256, 4, 40), opened(1000, 256, 16, 128),
]
MLA_POINTS = [
    closed(1000, 256, 1, 3), closed(1000, 256, 8, 16), closed(1000, 256, 32, 64), closed(1000, 256, 128, 256),
    closed(1000, 256, 256, 512), closed(8000, 256, 1, 3), closed(8000, 256, 8, 16), closed(8000, 256, 32, 48),
    closed(32000, 128, 1, 2), closed(32000, 128, 8, 8),
    opened(1000, 256, 4, 40), opened(1000, 256, 16, 128),
]
TP2_POINTS = [
    closed(1000, 256, 1, 3), closed(1000, 256, 8, 16), closed(1000, 256, 32, 64), closed(1000, 256, 128, 256),
    closed(8000, 256, 1, 2), closed(8000, 256, 8, 16), closed(32000, 128, 1, 2),
    opened(1000, 256, 2, 30),
]
# batch b4, on H200: points past the KV pool, where the engine must queue and preempt. The bf16 Llama-3.1-8B pool on
# an H200 holds about 886,000 tokens: 768 requests of 1,000 + 256 and 128 of 8,000 + 256 outgrow it as they decode;
# fp8 KV (about twice the pool) runs the same 8,000/256 point within it, and 768 of 1,000/256 beside the bf16 one.
# Qwen3-30B-A3B's bf16 pool (about 745,000 tokens) is outgrown by 96 requests of 8,000 + 256.
PAST_POOL_BF16 = [closed(1000, 256, 768, 1536), closed(8000, 256, 128, 256)]
PAST_POOL_FP8 = [closed(8000, 256, 128, 256), closed(1000, 256, 768, 1536)]
# a short warm-up point first (the first points after an MoE server's start ran slower in b2), then the one past it
PAST_POOL_MOE = [closed(1000, 64, 96, 96), closed(8000, 256, 96, 192)]
# a second MoE model (Mixtral-8x7B-v0.1 on one H200, then gpt-oss-20b): closed loop at 1, 16 and 64 in flight and one Poisson rate
MOE2_POINTS = [closed(1000, 256, 1, 3), closed(1000, 256, 16, 32), closed(1000, 256, 64, 128), opened(1000, 256, 8, 80)]
# batch b5, on H200: dense models of five sizes (1B to 70B; 16 to 80 layers) alone and at small batches, short and long
# prompts. One request's step is the weights read plus a per-layer cost; b1-b4 had one dense size, so the two could not
# be told apart (a fit over the one-request points of three models was collinear).
DENSE_POINTS = [closed(1000, 256, 1, 3), closed(1000, 256, 8, 16), closed(1000, 256, 32, 64), closed(8000, 256, 1, 3),
                closed(8000, 256, 16, 32)]

# batch b6, on H200: the most a replica holds under a latency target (issue 48's goal). Closed loop at fine steps of
# requests in flight and Poisson arrivals at fine steps of rate, 1,000/256 tokens, until past saturation, so that the
# largest load meeting a TTFT/TPOT target can be read off the measurements between neighbouring points.
SWEEP_CLOSED = [closed(1000, 256, c, 2 * c) for c in (48, 64, 80, 96, 112, 160, 192, 256)]
SWEEP_OPEN = [opened(1000, 256, rate, 20 * rate) for rate in (8, 12, 16, 20, 24, 28)]
# batch b7, on H200: what a prompt alone costs either side of the largest CUDA graph. One request's TTFT on the MoE
# models of b2/b4 is 20-80 ms above the simulation's prefill (Qwen3-30B-A3B: 99 ms measured for 1,000 tokens, 22
# simulated) while the dense models' is within a few ms; a step above max_cudagraph_capture_size (512 tokens by
# default) runs without a graph. The same prompts on the same server with graphs captured up to 2,048 tokens say
# whether the gap is the graphless launch; Llama-3.2-1B (the dense model whose step is smallest) is the control.
PREFILL_LADDER = [closed(n, 32, 1, 3) for n in (256, 500, 520, 1000, 2000, 4000, 8000)]
# and on the default Llama-3.2-1B server, many short requests streaming at once: its step is so short that the API
# server, not the engine, sets the pace (b5's 128 in flight: 111 chunks for 256 tokens, 6.84 ms between chunks
# against a 2.44 ms step); one point cannot tell a per-stream cost from a fixed one, these five can
STREAMS = [closed(128, 256, c, 2 * c) for c in (32, 64, 128, 256, 512)]
# batch b8, on H200: is the API server the bound at many streams? b6's Llama-3.1-8B closed loops grow their TTFT by
# about 9.5 ms a request in flight (0.75 s at 48, 3.2 s at 256; simulated 0.42-0.66 s) while Qwen3-30B-A3B's, whose
# steps are longer and whose streams send fewer chunks a second, do not; b7's Llama-3.2-1B at 128 and 256 in flight got
# a chunk every 13.8 and 27.8 ms (about 108 us a stream) against a GPU step of about 2 ms. The same servers with four
# API server processes (vllm serve --api-server-count 4, one engine) at the same loads: if the front end is the bound,
# these figures fall; if not, they stay. The one-API-server points repeat b6's and b7's (run to run spread).
FRONTEND_8B = [closed(1000, 256, c, 2 * c) for c in (64, 128, 256)] + [opened(1000, 256, 24, 480)]
FRONTEND_1B = [closed(128, 256, c, 2 * c) for c in (64, 128, 256, 512)]
# The front end's queue before a first token (b8: Llama-3.1-8B's closed-loop TTFT at 256 in flight 3.32 s under one
# API server, 0.99 s under four, 0.66 s simulated): open loops whose arrival rate walks the API server's load from
# light to past its streaming share, the prompt length apart (a request's handling may grow with its tokens), and
# the same loads under four API servers. Each open loop runs 40 s of arrivals.
FRONT_QUEUE_8B = [opened(1000, 256, r, 40 * r) for r in (8, 16, 20, 28)] + [opened(4000, 256, 10, 400)]
FRONT_QUEUE_1B = [opened(128, 256, r, 40 * r) for r in (30, 60, 90, 120)] + [opened(2000, 256, 30, 1200)]
# batch b10, on one H200: b9's Llama-3.2-1B under four API servers ran with three other servers on the same host
# (p50 ITL 5.4 and 28.6 ms at 90 and 120 requests/s, 1.9 simulated), where b8's closed loop of the same model reached
# 164 requests/s beside one other server. The same server and the two heaviest loads, alone on the host: if its ITL
# falls, b9's rise was the host's CPUs shared four ways, not the engine's own per-token work.
FRONT_QUEUE_1B_ALONE = [opened(128, 256, r, 40 * r) for r in (90, 120)]
# batch b11, on one H200: the engine core's own steps, timed from inside it (measure/step_trace.py), on the open loops
# where the simulation's median gap between tokens falls 30-40% short (Llama-3.1-8B at 24 requests/s: 17.1 ms
# measured in b6, 11.2 simulated; Llama-3.2-1B under four API servers at 90/s) and a closed loop of each beside it. A
# step's length against its prompt tokens and decoding requests tells a longer mixed step from an engine core that
# waits on the host, which the client's timestamps cannot.
STEPS_8B = [closed(1000, 256, 64, 128), opened(1000, 256, 16, 640), opened(1000, 256, 24, 960)]
STEPS_1B = [closed(128, 256, 256, 512), opened(128, 256, 90, 3600)]
# batch b12, on one H200: b11's trace put the simulation 4% short of Llama-3.1-8B's decode-only steps at 7 decoding
# and 17% short at about 150, and 37% over its steps carrying a prompt chunk. A closed-loop ladder of 16-256 in flight
# at 1,000-token prompts and 8-64 in flight at 8,000 moves the KV a step reads (tokens held) apart from the requests it
# decodes, so that the step's KV read and its per-request cost can be told apart; the same ladder with fp8 KV gives
# that format's read apart from bf16's, and Qwen3-30B-A3B's (an MoE, whose expert reads grow with the batch) the same
# for a second model. Every server's steps are timed from inside the engine core.
LADDER_8B = [closed(1000, 256, c, 2 * c) for c in (16, 32, 64, 128, 256)] + \
    [closed(8000, 256, c, 2 * c) for c in (8, 16, 32, 64)]
LADDER_MOE = [closed(1000, 256, c, 2 * c) for c in (16, 64, 192)] + [closed(8000, 256, c, 2 * c) for c in (8, 32)]
# batch b13, on one H200: the refit on b11-b12's traces (each request's cost a step, the KV read per format) held
# to a dense model it never saw at more than one request (Mistral-Nemo-12B: 40 layers, 8 KV heads of 128) over the
# same kind of ladder, its steps timed, its figures committed before it runs
LADDER_NEMO = [closed(1000, 256, c, 2 * c) for c in (32, 128)] + [closed(8000, 256, c, 2 * c) for c in (16, 48)]
# batch b14, on one H200: the KV formats the planner recommends past 8-bit that no engine run has read. `kvsize plan`
# on the README's workload picks int4_per_token_head once it may, and its speed came from kvsize's own decode kernel,
# not vLLM's. The b12 ladder (KV held against requests decoding, 1,000- and 8,000-token prompts), a 32,000-token
# point (where the format's KV read is most of a step) and one Poisson rate, on int4_per_token_head and
# int8_per_token_head KV, then int4 on Qwen3-30B-A3B; every server's steps timed, the figures committed before
FORMAT_LADDER = [closed(1000, 256, c, 2 * c) for c in (16, 64, 256)] + \
    [closed(8000, 256, c, 2 * c) for c in (8, 32, 64)] + [closed(32000, 128, 8, 8), opened(1000, 256, 16, 320)]
FORMAT_LADDER_MOE = [closed(1000, 256, c, 2 * c) for c in (16, 64)] + [closed(8000, 256, c, 2 * c) for c in (8, 32)]
# batch b15, on one H200 (or an H100 where that is lent): the per-token-head terms fitted on b14's Llama-3.1-8B held to
# a dense model they never saw (Mistral-Nemo-12B: 40 layers, 8 KV heads of 128) in int4_per_token_head and
# int8_per_token_head, on the b13 ladder and Poisson arrivals of 8,000-token prompts (a planner's traffic, where the
# slow prompt attention queues the next prompts); and the MLA cache in fp8, which no server ran (DeepSeek-V2-Lite)
FORMAT_CHECK = [closed(1000, 256, c, 2 * c) for c in (32, 128)] + [closed(8000, 256, c, 2 * c) for c in (16, 48)] + \
    [opened(8000, 256, r, 30 * r) for r in (1, 2)]
MLA_FP8 = [closed(1000, 256, c, 2 * c) for c in (1, 32, 128)] + [closed(8000, 256, c, 2 * c) for c in (8, 32)]
# batch b16, on two H200s: the whole-request kernel's waves and its split cache (fitted on b14's Llama-3.1-8B, 8 KV
# heads) held where the wave's edge falls elsewhere. Qwen2.5-32B (64 layers, 8 KV heads) in int4_per_token_head at
# 48 and 56 requests of 8,000 tokens (384 programs, one wave of 396 on an H200; 448, two); Qwen3-30B-A3B (4 KV heads:
# a split cache up to 32 requests, 99 requests a wave) in int8_per_token_head at 16, 40, 96 and 112. Then Llama-3.1-70B
# with fp8 KV at TP 2, its steps timed: the TP terms and the fp8 read share, fitted at TP 1, judged at TP 2
# with TP 2 (the 70B's points, some eight minutes) after the two lanes (each some eight minutes), one round of prompts a
# wave point: the prompts prefill one after another, then every request decodes together, its steps at the count asked
WAVE_EDGE_DENSE = [closed(8000, 256, c, c) for c in (48, 56)] + [closed(1000, 256, 128, 128)]
WAVE_EDGE_MOE = [closed(8000, 256, c, c) for c in (16, 40, 96, 112)] + [closed(1000, 256, 128, 128)]
# batch b17, on one H200: the graph estimate of a decode attention run unsplit (TRITON_ATTN; profiles/engines
# vllm-0.27-0.33.json unsplit_kv_formats), judged on a model and a format no server ran (Qwen3-8B, 36 layers, in
# fp8_per_token_head, which kvsize reads as int8_per_token_head's kernel twin), and that twin's speed: two short points
UNSPLIT_CHECK = [closed(1000, 256, 32, 32), closed(8000, 256, 16, 16)]
# batch b18, on two H200s side by side: what kept b16's Qwen3-30B-A3B in int8_per_token_head from its wave's edge at 99 requests
# (75.0 and 75.8 ms at 96 and 112, against 61.3 and 104.7 simulated). Qwen3-32B (8 KV heads, 8 queries a KV head, as
# the MoE's ratio; 64 layers, as Qwen2.5-32B, whose edge held) in int8 at 48 and 56 requests of 8,000 tokens, either
# side of 396 programs; Qwen2.5-7B-Instruct (dense, 4 KV heads as the MoE, 7 queries a KV head) in int8 at 40, 96
# and 112. An edge on both points at the MoE; on neither, at the queries a KV head (the kernel's BLOCK_Q)
RATIO_EDGE = [closed(8000, 256, c, c) for c in (48, 56)] + [closed(1000, 256, 128, 128)]
FOUR_HEAD_EDGE = [closed(8000, 256, c, c) for c in (40, 96, 112)]
# batch b19, on two H200s side by side: b18 put the missing edge on the queries a KV head (8 on Qwen3-30B-A3B and
# Qwen3-32B, no edge; 4, 5 and 7 on Llama-3.1-8B, Qwen2.5-32B and Qwen2.5-7B, an edge), where the family (Qwen3) fits
# the same split. Two servers in int8_per_token_head cross the two: Qwen2.5-3B (Qwen2, 2 KV heads, 8 queries a KV
# head) at 160 and 224 requests of 8,000 tokens, either side of 396 programs (198 requests); Qwen3-14B (Qwen3, 8 KV
# heads, 5 queries a KV head) at 48 and 56, either side of 49.5. An edge on Qwen3-14B and none on Qwen2.5-3B keeps
# it on the count; the other way round, on the family
COUNT_NOT_FAMILY_SMALL = [closed(8000, 256, c, c) for c in (160, 224)]
COUNT_NOT_FAMILY_QWEN3 = [closed(8000, 256, c, c) for c in (48, 56)]
# batch b20, on two H200s side by side: the waves fitted for 8 query heads a KV head (2 programs an SM, 264 on an H200;
# b16's and b18's Qwen3 traces) judged where their edge falls, with b19's points that did not run. Qwen2.5-3B (2 KV
# heads, 8 queries a KV head) in int8_per_token_head at 120, 144 and 224 requests of 8,000 tokens: 240 programs (one
# wave), 288 and 448 (two); the format's own 3 an SM would put one edge at 198 requests, between 144 and 224. Qwen3-14B
# (8 KV heads, 5) at 48 and 56: 384 and 448 programs, either side of the format's 396
GROUP_WAVES_SMALL = [closed(8000, 256, c, c) for c in (120, 144, 224)]
GROUP_WAVES_QWEN3 = [closed(8000, 256, c, c) for c in (48, 56)]
# batch b21, on two H200s side by side: b20 kept the edge where the waves of 2 programs an SM put it (between 120
# and 144 requests of Qwen2.5-3B) but not its size: one wave 91% full (120 requests, 240 programs) ran 38.1 ms a
# decode-only step against 26.9 simulated, two waves 46.8-47.8 against 49.7-51.4, so a wave's time depends on how
# full it is. A ladder on Qwen2.5-3B (8 queries a KV head, 2 KV heads) at 64, 96, 128, 136, 176 and 264 requests of
# 8,000 tokens: 128-528 programs, one wave from half to full, then two from a sliver to full. Beside it Qwen2.5-1.5B
# (6 queries a KV head, so the format's own 3 programs an SM, 396 a wave; 2 KV heads as the 3B) at 96, 160, 192,
# 208, 256 and 384: 192-768 programs, the same fills under the other kernel build. Steps timed on both
WAVE_FILL_SMALL = [closed(8000, 256, c, c) for c in (64, 96, 128, 136, 176, 264)]
WAVE_FILL_SIX = [closed(8000, 256, c, c) for c in (96, 160, 192, 208, 256, 384)]
# batch b22, on two H200s side by side: b20 and b21 timed steps of an 8,000-token prompt chunk beside ~110 decoders
# at 1.6-2.0x the simulation on Qwen2.5-3B and -1.5B in int8_per_token_head, whose prompt attention share was fitted
# on Llama-3.1-8B (4 queries a KV head). vLLM's Triton kernel gives each program BLOCK_M = 16 query rows: BLOCK_Q =
# 16 // (queries a KV head) prompt positions of one KV head, so the rows it fills are BLOCK_Q x queries (16 of 16 at
# 4 and 8, 15 at 5, 14 at 7, 12 at 6). One request in flight, prompts of 2,000, 8,000 and 32,000 tokens (32 out), on
# five models that cross the count: Qwen2.5-1.5B (6, 2 KV heads), Qwen2.5-3B (8, 2), Qwen2.5-7B (7, 4), Qwen3-14B
# (5, 8) and Llama-3.1-8B (4, 8); prompts alone, so the chunks' own attention is timed without decoders
PROMPT_TILES = [closed(2000, 32, 1, 3), closed(8000, 32, 1, 3), closed(32000, 32, 1, 2)]
# batch b23, on two H200s side by side: the program pace fitted on b22's one request (split segments) and on the
# Qwen3 traces (whole caches, 10.2 tokens a microsecond) judged where a whole cache is long and its programs few:
# Qwen2.5-3B (2 KV heads, 8 queries a KV head) in int8_per_token_head at 40 and 72 requests of 16,000 tokens (80 and
# 144 programs, one wave of 264), Qwen2.5-7B-Instruct (4 KV heads, 7) at 40 and 64 (160 and 256 of 396); each
# program walks 16,000 tokens a layer, about twice b21's, so the pace binds harder than the read shares
LONG_WAVES_SMALL = [closed(16000, 128, c, c) for c in (40, 72)]
LONG_WAVES_SEVEN = [closed(16000, 128, c, c) for c in (40, 64)]
# batch b24, on two H200s side by side: the SM rounds fitted on the format traces judged on three models no trace
# fitted, each a closed loop whose last requests finish one by one (the steps' ramp down through every count of
# requests): Qwen3-8B (8 KV heads, 4 queries a KV head, BLOCK_Q 4) at 48 of 16,000 tokens, whose whole-cache steps
# should climb from 24 to 25 requests (graphs of 24 and 32: 240 and 320 query blocks) and split ones at 4 -> 5, 8 -> 9
# and 12 -> 13 (128 segment programs a request, rounds of 528); Qwen2.5-1.5B (2, 6, BLOCK_Q 2) at 112 of 8,000, whose
# split steps (up to 64 requests, 32 programs each) should climb at 16 -> 17, 33 -> 34 and 49 -> 50 and whole ones
# from 88 to 89 (graphs of 88 and 96: 264 and 288 blocks; its real programs never pass 264 below 133);
# Qwen2.5-32B-Instruct (8, 5, BLOCK_Q 3) at 40 of 8,000, from 24 to 25 (256 and 336 blocks)
GRID_BLOCKS_EIGHT = [closed(16000, 128, 48, 48)]
GRID_BLOCKS_SMALL = [closed(8000, 128, 112, 112)]
GRID_BLOCKS_LARGE = [closed(8000, 128, 40, 40)]
# batch b25, on two H200s side by side: int4_per_token_head, whose decode no one-request point has timed (its split
# pace, and so its SM rounds, are not fitted: the simulation reads it at its split share alone), judged as b22 judged
# int8: one request of 8,000 and 32,000 tokens (32 out) on Qwen2.5-7B-Instruct (4 KV heads, 7 queries a KV head)
# and Llama-3.1-8B (8, 4); Qwen2.5-7B then at 24 of 16,000 tokens (1,536 segment programs, past two rounds of 528)
INT4_PACE = [closed(8000, 32, 1, 3), closed(32000, 32, 1, 2)]
INT4_ROUNDS = INT4_PACE + [closed(16000, 128, 24, 24)]
# batch b26, on two H200s side by side: int4_per_token_head's SM terms, never fitted (no ramp of its steps has run:
# b25's 24-request loop was left), judged on Qwen2.5-7B-Instruct (4 KV heads, 7 queries a KV head): 24 requests of
# 16,000 tokens, whose last ones finish one by one through every count of split steps (64 segment programs a
# request: 576 and 1,088 at 9 and 17 requests, past rounds of 528 if 4 an SM), and 64 of 8,000 through its
# whole-cache steps (graphs of 40 and 48 at 40 -> 41 requests: 240 and 288 blocks). Beside it the programs an SM
# holds, now fitted apart from the waves, judged where no trace fitted them: Qwen2.5-3B (2 KV heads, 8 queries a KV
# head) in int8_per_token_head at 136 requests of 16,000 tokens (its climbs at 88 -> 89 and 128 -> 129 twice as
# long a cache as b21's) and 176 of 4,000
INT4_RAMPS = [closed(16000, 128, 24, 24), closed(8000, 128, 64, 64)]
HELD_RAMPS = [closed(16000, 512, 136, 136), closed(4000, 128, 176, 176)]
# batch b27, on two H200s side by side: the SM terms fitted on b26's ramps and on the Qwen3 traces' ramps, judged
# where no ramp fitted them. Llama-3.1-8B (8 KV heads, 4 queries a KV head) in int4_per_token_head: 16 requests of
# 16,000 tokens (128 segment programs a request: 640, 1,152 and 1,664 at 5, 9 and 13 requests, past rounds of 528)
# and 48 of 8,000 (its whole-cache programs sharing an SM, not fitted: graphs of 24 and 32, 240 and 320 blocks);
# Qwen3-30B-A3B (4 KV heads, 8 queries a KV head) in int8_per_token_head at 72 requests of 12,000 tokens, longer than b16's
# 8,000 (graphs of 40, 48 and 72: 240, 288 and 432 blocks, the build's 4 an SM)
ROUNDS_CHECK_INT4 = [closed(16000, 128, 16, 16), closed(8000, 128, 48, 48)]
HELD_CHECK_MOE = [closed(12000, 128, 72, 72)]
# batch b28, on two H200s side by side: int4_per_token_head's split read as refitted on b25-b27 (a cost each KV layer
# once a step beside its programs' pace, the split bytes at the whole cache's share, rounds of 4 segment programs an
# SM), judged on three models no int4 point has run: one request of 8,000 and 32,000 tokens (the pace and the layer
# cost, 36 and 40 layers against the fit's 28 and 32), then a ramp. Qwen3-8B (8 KV heads, 4 queries a KV head, 128
# segment programs a request) at 16 of 16,000 tokens (rounds at 4 -> 5, 8 -> 9, 12 -> 13) and 48 of 8,000 (a third
# whole-cache program on an SM at 24 -> 25); Qwen3-14B (8, 5, BLOCK_Q 3) at 16 of 16,000; Qwen2.5-1.5B (2, 6, 32
# programs a request) at 64 of 16,000 (rounds at 16 -> 17, 33 -> 34 and 49 -> 50)
INT4_JUDGE_EIGHT = INT4_PACE + [closed(16000, 128, 16, 16), closed(8000, 128, 48, 48)]
INT4_JUDGE_FOURTEEN = INT4_PACE + [closed(16000, 128, 16, 16)]
INT4_JUDGE_SMALL = INT4_PACE + [closed(16000, 128, 64, 64)]
# batch b29, on two H200s side by side: the most requests a second a replica holds under a target (issue 48's goal),
# read off a ladder fine enough to bracket it: b6's open loops of Llama-3.1-8B (1,000 tokens in, 256 out) were 4/s
# apart, 20-33% at the knee, so 37 of 45 ladders' answers could not be read within 10%. Here 2/s apart from 18 to 32
# a second (7-11%), 30 s of arrivals each, in bf16 and in fp8 KV side by side (the fp8-over-bf16 gain at the knee)
KNEE_LADDER = [opened(1000, 256, rate, 30 * rate) for rate in (18, 20, 22, 24, 26, 28, 30, 32)]
TP2_LADDER = [closed(1000, 256, c, 2 * c) for c in (16, 64, 192)] + [closed(8000, 256, c, 2 * c) for c in (8, 32)] + \
    [opened(1000, 256, 4, 120)]

# batch b30, on two H200s side by side: the front end's handling as read off b22-b28's traces (a part the same for
# every request, one per prompt token on the way in and one on the first token's way back), judged on two bf16 servers
# no trace fitted it on: one request alone at 500-30,000 tokens (past the 8,000 it was read at); closed-loop bursts of
# 32 and 64 prompts of 1,000 tokens sent together (one wave each: whether an API server takes a burst's prompts one
# after another, so that the first step carries the first prompt alone); an open loop of 1,000-token prompts; the same
# under four API servers, which would take a burst four at a time
HANDLING_JUDGE = [closed(500, 32, 1, 3), closed(2000, 32, 1, 3), closed(4000, 32, 1, 3), closed(16000, 32, 1, 3),
                  closed(30000, 32, 1, 2), closed(1000, 64, 32, 32), closed(1000, 64, 64, 64),
                  opened(1000, 128, 8, 160)]
# batch b31, on two H200s side by side: the host's launch of a step past the largest CUDA graph (512 tokens). Under
# async scheduling the engine core launches a step before it takes the previous step's tokens, so the previous step's
# period shows the launch: b30's Qwen3-8B, a 1,000-token chunk beside 8 decoding requests, 37 ms before it and 4 after,
# the GPU's part about 24 ms; Llama-3.1-8B's (b29) 22 ms before and 11 after. One request alone at 400 tokens (under
# the graph) to 3,000 (past it), on four dense models of 28-40 layers whose GPU part at 600-1,000 tokens runs from far
# shorter than such a launch (Qwen2.5-1.5B) to about as long (Qwen3-14B); open loops of 1,000-token prompts beside a
# few decoding requests; and Qwen3-8B with graphs captured to 2,048 tokens, where the same prompts launch no layer
EAGER_LAUNCH = [closed(400, 32, 1, 4), closed(600, 32, 1, 4), closed(800, 32, 1, 4), closed(1000, 32, 1, 4),
                closed(1500, 32, 1, 4), closed(3000, 32, 1, 4), opened(1000, 128, 4, 60), opened(1000, 128, 8, 120)]


# batch b32, on two H200s side by side: a step with a prompt chunk under the largest CUDA graph. One request alone
# under the 512-token graph took 14-21 ms from schedule() to update on 28-40-layer models whose GPU part is 3-18 ms
# (b31), and the step before a chunk of Llama-3.2-1B's 128-token prompts beside 160 decoding requests lasted 8.4 ms
# where a decode step lasted 5.5 (b11): the host's launch of a step that replays the graph's pieces, its attention
# launched between them, which the simulation does not price. Prompts of 200-300 tokens alone, beside 3 long decoders,
# in a closed loop of 16 and in open loops of 4 and 16 a second, on models of 16 to 36 layers (whether it goes by the
# layer or by the step), and Qwen3-8B with graphs to 2,048 tokens at 1,000-token prompts (b31's open loops left)
PIECEWISE_PROMPTS = [closed(200, 32, 1, 4), closed(200, 512, 4, 8), closed(300, 128, 16, 48), opened(300, 128, 4, 60),
                     opened(300, 128, 16, 240)]
PIECEWISE_WIDE = PIECEWISE_PROMPTS + [opened(1000, 128, 4, 60), opened(1000, 128, 8, 120)]


# batch b33, on two H200s side by side: what a short prompt spends outside the engine's steps. b32's 200-token prompts
# alone spent 3.7 ms outside their steps before the first token (the client's TTFT less the trace's span from the
# prompt's schedule() to the update after it), where the handling read off b22-b28's 2,000-8,000-token prompts gives
# 1.0, and b22's line alone gives 1.5 ms beside 3.9 us a token. One request alone at 50-1,000 tokens (where the part
# the same for every request shows), a burst of 4 and of 16 sent together (whether an API server hands a burst over
# one request at a time) and an open loop, each server under one API server and under four, on two dense models
PROMPT_DOOR = [closed(50, 32, 1, 4), closed(100, 32, 1, 4), closed(200, 32, 1, 4), closed(500, 32, 1, 4),
               closed(1000, 32, 1, 4), closed(200, 32, 4, 4), closed(200, 32, 16, 16), opened(200, 128, 8, 120)]


# batch b34, on two H200s side by side: the handling's part the same for every request, now read at b30-b33's short
# prompts (3.2 ms), judged on models whose short prompts no fit read: Qwen2.5-32B and Qwen3-32B (64 layers, dense),
# Qwen3-30B-A3B (MoE) and DeepSeek-V2-Lite (MLA), in bf16. One request alone at 100 and 500 tokens, a closed loop of
# 16 and open loops of 4 and 16 a second of 300-token prompts (b32's open loops of short prompts were 12-41% short)
SHORT_JUDGE = [closed(100, 32, 1, 4), closed(500, 32, 1, 4), opened(300, 128, 4, 60), opened(300, 128, 16, 240),
               closed(300, 128, 16, 48)]

# batch b35, on two H200s side by side: the first token's way out under load, read request by request. b34's traces
# put a first token at the client with the update of its own step, not the next one's, and the API server holding a
# step's outputs together (a burst's first tokens reach the client within 0.05 ms of each other, all late by the
# burst's first outputs); the bursts and loops of b30-b34 were of short prompts. Each server runs one request alone at
# the lengths it then runs loaded (the client's and the trace's clocks are tied by the requests alone), bursts of 8
# and 32 prompts of 1,000 tokens and of 8 of 8,000 (a step after an eager prompt step), and an open loop, on a dense
# 8B, a dense 32B, an MoE and a model of 14B
WAY_OUT = [closed(1000, 64, 1, 4), closed(8000, 64, 1, 2), closed(1000, 128, 8, 16), closed(1000, 128, 32, 64),
           closed(8000, 128, 8, 16), opened(1000, 128, 8, 80)]

# batch b36, on two H200s side by side (another host than b35's): b35's requests alone at 1,000 tokens spent 12.7 ms
# (Llama-3.1-8B) outside the engine's steps beyond the per-token parts, where b30-b33's short prompts give 3.2 ms:
# the host's share of the handling, read again on a second host, with b35's bursts of 1,000-token prompts (their
# first tokens late by the step's other first outputs) and its open loop beside, on two of b35's models
WAY_OUT_AGAIN = [closed(50, 32, 1, 4), closed(200, 32, 1, 4), closed(1000, 64, 1, 4), closed(1000, 128, 8, 16),
                 closed(1000, 128, 32, 64), opened(1000, 128, 8, 80)]

# batch b37, on two H200s side by side: the API server's event loop (sizing/planners/front_end.py) judged on models no
# closed loop of many short prompts ran on, under one API server and four. Closed loops of 32-128 prompts of 1,000
# tokens (a closed loop of fixed lengths keeps its waves where the loop hands the replacements over late and
# together), a request alone to tie the clocks, and an open loop
WAVES = [closed(1000, 64, 1, 4), closed(1000, 128, 32, 64), closed(1000, 256, 64, 128), closed(1000, 256, 128, 256),
         opened(1000, 128, 16, 240)]

# batch b38, on two H200s side by side: how long a burst's first request waits in the API server as the burst grows.
# b32-b36's bursts of 4-48 waited about 2 ms a request sent with it (the loop reads them before handing the first
# over), b37's of 64 and 128 no more than of 32. Bursts alone (as many prompts as in flight, 32 tokens out) of 16 to
# 256 prompts of 1,000 tokens and of 64 of 200, with requests alone at both lengths to tie the clocks
BURST_SIZES = [closed(1000, 32, 1, 4), closed(1000, 32, 16, 16), closed(1000, 32, 32, 32), closed(1000, 32, 64, 64),
               closed(1000, 32, 128, 128), closed(1000, 32, 256, 256), closed(200, 32, 1, 4), closed(200, 32, 64, 64)]

# batch b39, on two H200s side by side: a MoE layer's prompt work, now the host's launch of its fused-MoE path past the
# largest CUDA graph (read off b35's Qwen3-30B-A3B prompts alone) and its routed experts' grouped GEMMs at a share of
# the prefill rate (Qwen3-30B-A3B's prompts of 8,000 tokens and more), judged on the MoE models no fit read, Mixtral-8x7B
# (32 layers of 8 experts, 2 a token) and DeepSeek-V2-Lite (MLA, 26 MoE layers of 64), and on Qwen3-30B-A3B on another
# host. One request alone under the 512-token graph and past it (1,000-16,000 tokens), a burst of 16 and open loops of
# 4 and 12 a second of 1,000-token prompts (each prompt step beside the decoding requests runs past the graph)
MOE_JUDGE = [closed(300, 32, 1, 4), closed(1000, 32, 1, 4), closed(2000, 32, 1, 4), closed(4000, 32, 1, 3),
             closed(16000, 32, 1, 2), closed(1000, 128, 16, 32), opened(1000, 128, 4, 40), opened(1000, 128, 12, 120)]

# batch b40, on two H200s side by side: the fused-MoE tiles' fixed cost (k0, fitted on Qwen3-30B-A3B's experts of 2,048
# and 768) judged on expert shapes no fit read: Phi-3.5-MoE (hidden 4,096, experts of 6,400, 16 of them, 2 a token)
# and GLM-4.7-Flash (MLA, hidden 2,048, experts of 1,536, 64 of them, 4 a token); and the MoE launch on a third host's
# Qwen3-30B-A3B. One request alone under the graph and past it (1,000-16,000 tokens) and an open loop of 4 a second
MOE_SHAPES = [closed(300, 32, 1, 4), closed(1000, 32, 1, 4), closed(4000, 32, 1, 3), closed(16000, 32, 1, 2),
              opened(1000, 128, 4, 40)]


def server(tag: str, batch: str, model: str, gpus: str, port: int, max_model_len: int, points: list[dict],
           kv_cache_dtype: str = "auto", tp: int = 1, prefill_tokens_per_s: float = 15000.0,
           itl_guess_s: float = 0.012, tokenizer_only: bool = False, instead_of: str | None = None,
           max_cudagraph_capture_size: int | None = None, api_server_count: int | None = None,
           step_trace: bool = False) -> dict:
    pts = []
    for k, p in enumerate(points, start=1):
        if p["concurrency"] is not None:
            rounds = -(-p["num_prompts"] // p["concurrency"])
            itl = itl_guess_s * (1 + p["concurrency"] / 128)
            busy = p["num_prompts"] * p["input_len"] / prefill_tokens_per_s + rounds * p["output_len"] * itl
        else:
            busy = p["num_prompts"] / p["request_rate"] + p["output_len"] * itl_guess_s * 3
        # a rough guess of the point's wall time (its test request included), only to decide whether it still
        # fits before a command's deadline
        est = 6 + busy + p["input_len"] / prefill_tokens_per_s + p["output_len"] * itl_guess_s
        load = f"c{p['concurrency']}" if p["concurrency"] is not None else f"r{p['request_rate']:g}"
        pts.append(dict(id=f"{tag}-p{k:02d}-i{p['input_len']}-o{p['output_len']}-{load}", seed=k, est_s=round(est),
                        **p))
    extra = {}
    if tokenizer_only:
        # transformers 5 picks the tokenizer class from config.json's model_type (qwen2: Qwen2Tokenizer, a BPE that
        # turns the word-level vocabulary's "w123" prompts into no tokens at all): the server and the load generator
        # read the word-level tokenizer from a folder without the config.json instead
        extra["tokenizer"] = f"tokenizers/{model}"
    if instead_of:
        # started only where the server named failed to start (a fallback the lane decides on the machine)
        extra["instead_of"] = instead_of
    if max_cudagraph_capture_size:
        # passed as --compilation-config '{"max_cudagraph_capture_size": N}'
        extra["max_cudagraph_capture_size"] = max_cudagraph_capture_size
    if api_server_count:
        # started as `vllm serve MODEL --api-server-count N` (the api_server module runs one API server only)
        extra["api_server_count"] = api_server_count
    if step_trace:
        # the engine core writes one line per schedule() and update_from_output() call (measure/step_trace.py)
        extra["step_trace"] = True
    return dict(tag=tag, batch=batch, model=model, config=f"measure/serving/models/{model}/config.json", gpus=gpus, **extra,
                port=port, tensor_parallel_size=tp, kv_cache_dtype=kv_cache_dtype, max_model_len=max_model_len,
                max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS, max_num_seqs=MAX_NUM_SEQS,
                gpu_memory_utilization=GPU_MEMORY_UTILIZATION, enable_prefix_caching=False, points=pts)


def frontend_pair(tag: str, batch: str, model: str, gpus: str, port: int, max_model_len: int, points: list[dict],
                  prefill_tokens_per_s: float, itl_guess_s: float, **options) -> tuple[dict, dict]:
    """One server under vLLM's one API server and the same under four (`TAG-api4`, the next port): the front-end
    batches run every load both ways (`options`: server()'s others, the same for both)."""
    return tuple(server(f"{tag}{suffix}", batch, model, gpus, port + i, max_model_len, points,
                        prefill_tokens_per_s=prefill_tokens_per_s, itl_guess_s=itl_guess_s, **extra, **options)
                 for i, (suffix, extra) in enumerate((("", {}), ("-api4", {"api_server_count": 4}))))


def launch_server(tag: str, batch: str, model: str, gpus: str, port: int, points: list[dict], itl_guess_s: float,
                  prefill_tokens_per_s: float, **extra) -> dict:
    """A server of the launch batches (b31 on) and of b34: a model in bf16 at 32,768 tokens, its steps timed, a Qwen
    model's word-level tokenizer read from its own folder."""
    return server(tag, batch, model, gpus, port, 32768, points, itl_guess_s=itl_guess_s,
                  prefill_tokens_per_s=prefill_tokens_per_s, step_trace=True, tokenizer_only=model.startswith("qwen"),
                  **extra)


def launch_servers(batch: str, points: list[dict], rows: tuple) -> list[dict]:
    """launch_server for each (tag, model, GPUs, port, ITL guess, prefill tokens/s) row, tagged by the batch's
    number (b34 on)."""
    number = batch.split("-")[0]
    return [launch_server(f"{number}-{tag}", batch, model, gpus, port, points, itl, tokens_per_s)
            for tag, model, gpus, port, itl, tokens_per_s in rows]


def wave_server(tag: str, batch: str, model: str, gpus: str, port: int, points: list[dict],
                prefill_tokens_per_s: float, itl_guess_s: float, kv_cache_dtype: str = "int8_per_token_head") -> dict:
    """A server of the wave batches (b18 on): a Qwen model in a per-token-head format (int8_per_token_head unless
    named) at 32,768 tokens, read through the word-level tokenizer's own folder, its steps timed."""
    return server(tag, batch, model, gpus, port, 32768, points, kv_cache_dtype=kv_cache_dtype,
                  prefill_tokens_per_s=prefill_tokens_per_s, itl_guess_s=itl_guess_s, tokenizer_only=True,
                  step_trace=True)


def plan() -> dict:
    b1, b2, b3, b4, b5 = "b1-llama8b", "b2-moe-mla", "b3-tp2-32b", "b4-past-pool-moe2", "b5-dense-sizes"
    b6, b7, b8, b9 = "b6-rate-sweep", "b7-prefill-graphs", "b8-frontend", "b9-frontend-queue"
    b10, b11, b12, b13 = "b10-host-alone", "b11-step-trace", "b12-step-ladder", "b13-refit-check"
    b14, b15, b16, b17 = "b14-kv-formats", "b15-format-check", "b16-wave-edges", "b17-unsplit-check"
    b18, b19, b20, b21 = "b18-wave-ratio", "b19-count-or-family", "b20-group-waves", "b21-wave-fill"
    b22, b23, b24, b25 = "b22-prompt-tiles", "b23-long-waves", "b24-grid-blocks", "b25-int4-pace"
    b26, b27, b28, b29 = "b26-held-ramps", "b27-ramps-check", "b28-int4-judge", "b29-knee-ladder"
    b30, b31, b32, b33 = "b30-front-door", "b31-eager-launch", "b32-piecewise-prompts", "b33-prompt-door"
    b34, b35, b36 = "b34-short-judge", "b35-way-out", "b36-way-out-again"
    ran = {b1: {"0": ["llama8b-bf16", "qwen3moe-bf16"], "1": ["llama8b-fp8", "dsv2lite-bf16"],
                "0,1": ["qwen25-32b-tp2-bf16"]}}
    ran[b2], ran[b3] = ran[b1], ran[b1]  # b1-b3 ran as one set of lanes
    ran[b4] = {"0": ["b4-llama8b-bf16", "b4-qwen3moe-bf16"], "1": ["b4-llama8b-fp8", "b4-mixtral", "b4-gptoss20b"],
               "0,1": []}
    ran[b5] = {"0": ["b5-llama1b", "b5-qwen3-8b"], "1": ["b5-qwen25-32b", "b5-nemo12b"], "0,1": ["b5-llama70b-tp2-fp8"]}
    ran[b6] = {"0": ["b6-llama8b-bf16"], "1": ["b6-qwen3moe-bf16"], "0,1": []}
    ran[b7] = {"0": ["b7-qwen3moe", "b7-qwen3moe-cg2048"], "1": ["b7-llama1b", "b7-llama1b-cg2048"], "0,1": []}
    ran[b8] = {"0": ["b8-llama8b", "b8-llama8b-api4"], "1": ["b8-llama1b", "b8-llama1b-api4"], "0,1": []}
    ran[b9] = {"0": ["b9-llama8b", "b9-llama8b-api4"], "1": ["b9-llama1b", "b9-llama1b-api4"], "0,1": []}
    ran[b10] = {"0": ["b10-llama1b-api4"], "1": [], "0,1": []}
    # the newest batch, on a one-GPU machine: what the kit runs
    ran[b11] = {"0": ["b11-llama8b", "b11-llama1b-api4"], "1": [], "0,1": []}
    ran[b12] = {"0": ["b12-llama8b-bf16", "b12-llama8b-fp8", "b12-qwen3moe"], "1": [], "0,1": []}
    ran[b13] = {"0": ["b13-nemo12b"], "1": [], "0,1": []}
    ran[b14] = {"0": ["b14-llama8b-int4", "b14-llama8b-int8", "b14-qwen3moe-int4"], "1": [], "0,1": []}
    ran[b15] = {"0": ["b15-nemo12b-int4", "b15-nemo12b-int8", "b15-dsv2lite-fp8"], "1": [], "0,1": []}
    # ran on one H200, its lanes one after another; its TP 2 lane waits for a machine of two GPUs
    ran[b16] = {"0": ["b16-qwen25-32b-int4"], "1": ["b16-qwen3moe-int8"], "0,1": ["b16-llama70b-tp2-fp8"]}
    ran[b17] = {"0": ["b17-qwen3-8b-fp8pth"], "1": [], "0,1": []}
    # ran on two H200s: b18's servers side by side, then b16's TP 2 lane
    ran[b18] = {"0": ["b18-qwen3-32b-int8"], "1": ["b18-qwen25-7b-int8"], "0,1": []}
    # ran in part on two H200s (one point a server: the device time ran out)
    ran[b19] = {"0": ["b19-qwen25-3b-int8"], "1": ["b19-qwen3-14b-int8"], "0,1": []}
    ran[b20] = {"0": ["b20-qwen25-3b-int8"], "1": ["b20-qwen3-14b-int8"], "0,1": []}
    ran[b21] = {"0": ["b21-qwen25-3b-int8"], "1": ["b21-qwen25-15b-int8"], "0,1": []}
    # ran on two H200s side by side
    ran[b22] = {"0": ["b22-qwen25-3b-int8", "b22-qwen3-14b-int8"],
                "1": ["b22-qwen25-15b-int8", "b22-qwen25-7b-int8", "b22-llama8b-int8"], "0,1": []}
    ran[b23] = {"0": ["b23-qwen25-3b-int8"], "1": ["b23-qwen25-7b-int8"], "0,1": []}
    ran[b24] = {"0": ["b24-qwen3-8b-int8", "b24-qwen25-15b-int8"], "1": ["b24-qwen25-32b-int8"], "0,1": []}
    # ran in part on two H200s (Qwen2.5-7B's 24-request loop was left, and runs again in b26)
    ran[b25] = {"0": ["b25-qwen25-7b-int4"], "1": ["b25-llama8b-int4"], "0,1": []}
    # ran on two H200s side by side
    ran[b26] = {"0": ["b26-qwen25-7b-int4"], "1": ["b26-qwen25-3b-int8"], "0,1": []}
    # ran on two H200s side by side
    ran[b27] = {"0": ["b27-llama8b-int4"], "1": ["b27-qwen3moe-int8"], "0,1": []}
    ran[b28] = {"0": ["b28-qwen3-8b-int4"], "1": ["b28-qwen3-14b-int4", "b28-qwen25-15b-int4"], "0,1": []}
    ran[b29] = {"0": ["b29-llama8b-bf16"], "1": ["b29-llama8b-fp8"], "0,1": []}
    ran[b30] = {"0": ["b30-qwen3-8b", "b30-qwen3-8b-api4"], "1": ["b30-nemo12b", "b30-nemo12b-api4"], "0,1": []}
    # ran on two H200s side by side (38 of its 40 points: the Qwen3-8B-cg2048 open loops run again in b32)
    ran[b31] = {"0": ["b31-qwen3-14b", "b31-qwen25-7b", "b31-qwen3-8b-cg2048"], "1": ["b31-llama8b", "b31-qwen25-15b"],
                "0,1": []}
    # ran on two H200s side by side (its last two servers added before they ran, on a second machine)
    ran[b32] = {"0": ["b32-llama1b", "b32-qwen3-8b-cg2048", "b32-qwen25-7b", "b32-qwen3-14b"],
                "1": ["b32-qwen25-15b", "b32-llama8b", "b32-qwen25-3b"], "0,1": []}
    # ran on two H200s side by side
    ran[b33] = {"0": ["b33-llama8b", "b33-llama8b-api4"], "1": ["b33-qwen25-15b", "b33-qwen25-15b-api4"], "0,1": []}
    # ran on two H200s side by side
    ran[b34] = {"0": ["b34-qwen25-32b", "b34-qwen3-32b"], "1": ["b34-qwen3moe", "b34-dsv2lite"], "0,1": []}
    # ran on two H200s side by side
    ran[b35] = {"0": ["b35-llama8b", "b35-qwen25-32b"], "1": ["b35-qwen3moe", "b35-qwen3-14b"], "0,1": []}
    # ran on two H200s side by side, on another host than b35's
    ran[b36] = {"0": ["b36-llama8b"], "1": ["b36-qwen3-14b"], "0,1": []}
    b37, b38 = "b37-waves", "b38-burst-sizes"
    ran[b37] = {"0": ["b37-qwen3-8b", "b37-qwen3-8b-api4"], "1": ["b37-qwen25-7b", "b37-qwen25-7b-api4"], "0,1": []}
    ran[b38] = {"0": ["b38-llama8b"], "1": ["b38-qwen3-8b"], "0,1": []}
    b39 = "b39-moe-launch"
    ran[b39] = {"0": ["b39-mixtral"], "1": ["b39-qwen3moe", "b39-dsv2lite"], "0,1": []}
    b40 = "b40-moe-tiles"
    # the newest batch, what the kit runs
    ran[b40] = {"0": ["b40-phimoe", "b40-qwen3moe"], "1": ["b40-glm47flash"], "0,1": []}
    return dict(
        vllm_version=VLLM_VERSION, gpu=GPU, load_format="dummy",
        bench="vllm bench serve --backend vllm --dataset-name random (ignore_eos), --percentile-metrics "
              "ttft,tpot,itl,e2el --metric-percentiles 50,90,99 --save-result --save-detailed",
        batches=[b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15, b16, b17, b18, b19, b20, b21, b22, b23,
                 b24, b25, b26, b27, b28, b29, b30, b31, b32, b33, b34, b35, b36, b37, b38, b39, b40],
        # lanes run side by side; a lane's servers run one after another; '0,1' runs once both others are done.
        # `lanes` are the newest batch's (what the kit runs); `lanes_by_batch` keeps each batch's
        lanes=ran[b40], lanes_by_batch=ran,
        servers=[
            server("llama8b-bf16", b1, "llama-3.1-8b", "0", 8101, 65536, LLAMA_POINTS),
            server("llama8b-fp8", b1, "llama-3.1-8b", "1", 8102, 65536, LLAMA_POINTS, kv_cache_dtype="fp8"),
            server("qwen3moe-bf16", b2, "qwen3-30b-a3b", "0", 8103, 32768, MOE_POINTS, prefill_tokens_per_s=20000,
                   itl_guess_s=0.015),
            server("dsv2lite-bf16", b2, "deepseek-v2-lite", "1", 8104, 32768, MLA_POINTS,
                   prefill_tokens_per_s=20000),
            server("qwen25-32b-tp2-bf16", b3, "qwen2.5-32b-instruct", "0,1", 8105, 32768, TP2_POINTS, tp=2,
                   prefill_tokens_per_s=8000, itl_guess_s=0.02, tokenizer_only=True),
            server("b4-llama8b-bf16", b4, "llama-3.1-8b", "0", 8111, 65536, PAST_POOL_BF16, prefill_tokens_per_s=30000,
                   itl_guess_s=0.02),
            server("b4-llama8b-fp8", b4, "llama-3.1-8b", "1", 8112, 65536, PAST_POOL_FP8, kv_cache_dtype="fp8",
                   prefill_tokens_per_s=30000, itl_guess_s=0.02),
            server("b4-qwen3moe-bf16", b4, "qwen3-30b-a3b", "0", 8113, 32768, PAST_POOL_MOE,
                   prefill_tokens_per_s=20000, itl_guess_s=0.02),
            # gpt-oss-20b (MXFP4 experts, alternating sliding and full attention with sinks) last, where time is
            # left: its OpenAI server was feared to fetch its harmony vocabulary at start (the GPU machine has no
            # network); it started offline all the same. transformers 5 would pick its tokenizer class from
            # model_type, so the word-level tokenizer is read from its own folder
            server("b4-gptoss20b", b4, "gpt-oss-20b", "1", 8114, 32768, MOE2_POINTS, prefill_tokens_per_s=30000,
                   tokenizer_only=True),
            server("b4-mixtral", b4, "mixtral-8x7b-v0.1", "1", 8115, 32768, MOE2_POINTS, prefill_tokens_per_s=15000,
                   itl_guess_s=0.015),
            server("b5-llama1b", b5, "llama-3.2-1b-instruct", "0", 8121, 32768,
                   DENSE_POINTS + [closed(1000, 256, 128, 256)], prefill_tokens_per_s=60000, itl_guess_s=0.004),
            server("b5-qwen3-8b", b5, "qwen3-8b", "0", 8122, 32768, DENSE_POINTS, prefill_tokens_per_s=30000,
                   itl_guess_s=0.008, tokenizer_only=True),
            server("b5-qwen25-32b", b5, "qwen2.5-32b-instruct", "1", 8123, 32768, DENSE_POINTS,
                   prefill_tokens_per_s=8000, itl_guess_s=0.025, tokenizer_only=True),
            server("b5-nemo12b", b5, "mistral-nemo-instruct-2407", "1", 8124, 32768, DENSE_POINTS,
                   prefill_tokens_per_s=20000, itl_guess_s=0.01, tokenizer_only=True),
            # the 70B with fp8 KV that issue 48 asks for at TP 4, at TP 2 (two H200s hold its bf16 weights)
            server("b5-llama70b-tp2-fp8", b5, "llama-3.1-70b", "0,1", 8125, 32768, DENSE_POINTS, kv_cache_dtype="fp8",
                   tp=2, prefill_tokens_per_s=8000, itl_guess_s=0.02),
            server("b6-llama8b-bf16", b6, "llama-3.1-8b", "0", 8131, 65536, SWEEP_CLOSED + SWEEP_OPEN,
                   prefill_tokens_per_s=30000, itl_guess_s=0.01),
            server("b6-qwen3moe-bf16", b6, "qwen3-30b-a3b", "1", 8132, 32768, SWEEP_CLOSED + SWEEP_OPEN,
                   prefill_tokens_per_s=20000, itl_guess_s=0.015),
            server("b7-qwen3moe", b7, "qwen3-30b-a3b", "0", 8141, 32768, PREFILL_LADDER, prefill_tokens_per_s=20000),
            server("b7-qwen3moe-cg2048", b7, "qwen3-30b-a3b", "0", 8142, 32768, PREFILL_LADDER,
                   prefill_tokens_per_s=20000, max_cudagraph_capture_size=2048),
            server("b7-llama1b", b7, "llama-3.2-1b-instruct", "1", 8143, 32768, PREFILL_LADDER + STREAMS,
                   prefill_tokens_per_s=60000, itl_guess_s=0.004),
            server("b7-llama1b-cg2048", b7, "llama-3.2-1b-instruct", "1", 8144, 32768, PREFILL_LADDER,
                   prefill_tokens_per_s=60000, itl_guess_s=0.004, max_cudagraph_capture_size=2048),
            *frontend_pair("b8-llama8b", b8, "llama-3.1-8b", "0", 8151, 65536, FRONTEND_8B, 30000, 0.01),
            *frontend_pair("b8-llama1b", b8, "llama-3.2-1b-instruct", "1", 8153, 32768, FRONTEND_1B, 60000, 0.004),
            *frontend_pair("b9-llama8b", b9, "llama-3.1-8b", "0", 8161, 65536, FRONT_QUEUE_8B, 30000, 0.01),
            *frontend_pair("b9-llama1b", b9, "llama-3.2-1b-instruct", "1", 8163, 32768, FRONT_QUEUE_1B, 60000, 0.004),
            server("b10-llama1b-api4", b10, "llama-3.2-1b-instruct", "0", 8171, 32768, FRONT_QUEUE_1B_ALONE,
                   prefill_tokens_per_s=60000, itl_guess_s=0.004, api_server_count=4),
            server("b11-llama8b", b11, "llama-3.1-8b", "0", 8181, 65536, STEPS_8B, prefill_tokens_per_s=30000,
                   itl_guess_s=0.01, step_trace=True),
            server("b11-llama1b-api4", b11, "llama-3.2-1b-instruct", "0", 8182, 32768, STEPS_1B,
                   prefill_tokens_per_s=60000, itl_guess_s=0.004, api_server_count=4, step_trace=True),
            server("b12-llama8b-bf16", b12, "llama-3.1-8b", "0", 8191, 65536, LADDER_8B, prefill_tokens_per_s=30000,
                   itl_guess_s=0.01, step_trace=True),
            server("b12-llama8b-fp8", b12, "llama-3.1-8b", "0", 8192, 65536, LADDER_8B, kv_cache_dtype="fp8",
                   prefill_tokens_per_s=30000, itl_guess_s=0.01, step_trace=True),
            server("b12-qwen3moe", b12, "qwen3-30b-a3b", "0", 8193, 32768, LADDER_MOE, prefill_tokens_per_s=20000,
                   itl_guess_s=0.015, step_trace=True),
            server("b13-nemo12b", b13, "mistral-nemo-instruct-2407", "0", 8201, 32768, LADDER_NEMO,
                   prefill_tokens_per_s=20000, itl_guess_s=0.01, tokenizer_only=True, step_trace=True),
            server("b14-llama8b-int4", b14, "llama-3.1-8b", "0", 8211, 65536, FORMAT_LADDER,
                   kv_cache_dtype="int4_per_token_head", prefill_tokens_per_s=30000, itl_guess_s=0.01, step_trace=True),
            server("b14-llama8b-int8", b14, "llama-3.1-8b", "0", 8212, 65536, FORMAT_LADDER,
                   kv_cache_dtype="int8_per_token_head", prefill_tokens_per_s=30000, itl_guess_s=0.01, step_trace=True),
            server("b14-qwen3moe-int4", b14, "qwen3-30b-a3b", "0", 8213, 32768, FORMAT_LADDER_MOE,
                   kv_cache_dtype="int4_per_token_head", prefill_tokens_per_s=20000, itl_guess_s=0.015,
                   step_trace=True),
            server("b15-nemo12b-int4", b15, "mistral-nemo-instruct-2407", "0", 8221, 32768, FORMAT_CHECK,
                   kv_cache_dtype="int4_per_token_head", prefill_tokens_per_s=8000, itl_guess_s=0.02,
                   tokenizer_only=True, step_trace=True),
            server("b15-nemo12b-int8", b15, "mistral-nemo-instruct-2407", "0", 8222, 32768, FORMAT_CHECK,
                   kv_cache_dtype="int8_per_token_head", prefill_tokens_per_s=8000, itl_guess_s=0.02,
                   tokenizer_only=True, step_trace=True),
            server("b15-dsv2lite-fp8", b15, "deepseek-v2-lite", "0", 8223, 32768, MLA_FP8, kv_cache_dtype="fp8",
                   prefill_tokens_per_s=20000, itl_guess_s=0.015, step_trace=True),
            server("b16-qwen25-32b-int4", b16, "qwen2.5-32b-instruct", "0", 8231, 32768, WAVE_EDGE_DENSE,
                   kv_cache_dtype="int4_per_token_head", prefill_tokens_per_s=4000, itl_guess_s=0.04,
                   tokenizer_only=True, step_trace=True),
            server("b16-qwen3moe-int8", b16, "qwen3-30b-a3b", "1", 8232, 32768, WAVE_EDGE_MOE,
                   kv_cache_dtype="int8_per_token_head", prefill_tokens_per_s=8000, itl_guess_s=0.03, step_trace=True),
            server("b16-llama70b-tp2-fp8", b16, "llama-3.1-70b", "0,1", 8233, 32768, TP2_LADDER, kv_cache_dtype="fp8",
                   tp=2, prefill_tokens_per_s=8000, itl_guess_s=0.025, step_trace=True),
            server("b17-qwen3-8b-fp8pth", b17, "qwen3-8b", "0", 8241, 32768, UNSPLIT_CHECK,
                   kv_cache_dtype="fp8_per_token_head", prefill_tokens_per_s=15000, itl_guess_s=0.015,
                   step_trace=True),
            wave_server("b18-qwen3-32b-int8", b18, "qwen3-32b", "0", 8251, RATIO_EDGE, 4000, 0.04),
            wave_server("b18-qwen25-7b-int8", b18, "qwen2.5-7b-instruct", "1", 8252, FOUR_HEAD_EDGE, 15000, 0.03),
            wave_server("b19-qwen25-3b-int8", b19, "qwen2.5-3b", "0", 8261, COUNT_NOT_FAMILY_SMALL, 40000, 0.03),
            wave_server("b19-qwen3-14b-int8", b19, "qwen3-14b", "1", 8262, COUNT_NOT_FAMILY_QWEN3, 10000, 0.05),
            wave_server("b20-qwen25-3b-int8", b20, "qwen2.5-3b", "0", 8271, GROUP_WAVES_SMALL, 40000, 0.03),
            wave_server("b20-qwen3-14b-int8", b20, "qwen3-14b", "1", 8272, GROUP_WAVES_QWEN3, 10000, 0.05),
            wave_server("b21-qwen25-3b-int8", b21, "qwen2.5-3b", "0", 8281, WAVE_FILL_SMALL, 40000, 0.03),
            wave_server("b21-qwen25-15b-int8", b21, "qwen2.5-1.5b", "1", 8282, WAVE_FILL_SIX, 60000, 0.03),
            wave_server("b22-qwen25-3b-int8", b22, "qwen2.5-3b", "0", 8291, PROMPT_TILES, 30000, 0.01),
            wave_server("b22-qwen3-14b-int8", b22, "qwen3-14b", "0", 8292, PROMPT_TILES, 10000, 0.02),
            wave_server("b22-qwen25-15b-int8", b22, "qwen2.5-1.5b", "1", 8293, PROMPT_TILES, 40000, 0.01),
            wave_server("b22-qwen25-7b-int8", b22, "qwen2.5-7b-instruct", "1", 8294, PROMPT_TILES, 15000, 0.015),
            server("b22-llama8b-int8", b22, "llama-3.1-8b", "1", 8295, 32768, PROMPT_TILES,
                   kv_cache_dtype="int8_per_token_head", prefill_tokens_per_s=15000, itl_guess_s=0.015,
                   step_trace=True),
            wave_server("b23-qwen25-3b-int8", b23, "qwen2.5-3b", "0", 8301, LONG_WAVES_SMALL, 12000, 0.06),
            wave_server("b23-qwen25-7b-int8", b23, "qwen2.5-7b-instruct", "1", 8302, LONG_WAVES_SEVEN, 7000, 0.06),
            wave_server("b24-qwen3-8b-int8", b24, "qwen3-8b", "0", 8311, GRID_BLOCKS_EIGHT, 6000, 0.06),
            wave_server("b24-qwen25-15b-int8", b24, "qwen2.5-1.5b", "0", 8312, GRID_BLOCKS_SMALL, 20000, 0.03),
            wave_server("b24-qwen25-32b-int8", b24, "qwen2.5-32b-instruct", "1", 8313, GRID_BLOCKS_LARGE, 2500,
                        0.08),
            wave_server("b25-qwen25-7b-int4", b25, "qwen2.5-7b-instruct", "0", 8321, INT4_ROUNDS, 6000, 0.04,
                        kv_cache_dtype="int4_per_token_head"),
            server("b25-llama8b-int4", b25, "llama-3.1-8b", "1", 8322, 32768, INT4_PACE,
                   kv_cache_dtype="int4_per_token_head", prefill_tokens_per_s=10000, itl_guess_s=0.015,
                   step_trace=True),
            wave_server("b26-qwen25-7b-int4", b26, "qwen2.5-7b-instruct", "0", 8331, INT4_RAMPS, 6000, 0.04,
                        kv_cache_dtype="int4_per_token_head"),
            wave_server("b26-qwen25-3b-int8", b26, "qwen2.5-3b", "1", 8332, HELD_RAMPS, 12000, 0.06),
            server("b27-llama8b-int4", b27, "llama-3.1-8b", "0", 8341, 32768, ROUNDS_CHECK_INT4,
                   kv_cache_dtype="int4_per_token_head", prefill_tokens_per_s=8000, itl_guess_s=0.03, step_trace=True),
            server("b27-qwen3moe-int8", b27, "qwen3-30b-a3b", "1", 8342, 32768, HELD_CHECK_MOE,
                   kv_cache_dtype="int8_per_token_head", prefill_tokens_per_s=8000, itl_guess_s=0.1, step_trace=True),
            wave_server("b28-qwen3-8b-int4", b28, "qwen3-8b", "0", 8351, INT4_JUDGE_EIGHT, 8000, 0.03,
                        kv_cache_dtype="int4_per_token_head"),
            wave_server("b28-qwen3-14b-int4", b28, "qwen3-14b", "1", 8352, INT4_JUDGE_FOURTEEN, 5000, 0.04,
                        kv_cache_dtype="int4_per_token_head"),
            wave_server("b28-qwen25-15b-int4", b28, "qwen2.5-1.5b", "1", 8353, INT4_JUDGE_SMALL, 20000, 0.03,
                        kv_cache_dtype="int4_per_token_head"),
            server("b29-llama8b-bf16", b29, "llama-3.1-8b", "0", 8361, 65536, KNEE_LADDER, itl_guess_s=0.015,
                   step_trace=True),
            server("b29-llama8b-fp8", b29, "llama-3.1-8b", "1", 8362, 65536, KNEE_LADDER, kv_cache_dtype="fp8",
                   itl_guess_s=0.015, step_trace=True),
            *(server(f"b30-{tag}{suffix}", b30, model, gpu, port + i, 32768, HANDLING_JUDGE, itl_guess_s=itl,
                     prefill_tokens_per_s=tokens_per_s, step_trace=True, **extra)
              for tag, model, gpu, port, itl, tokens_per_s in (("qwen3-8b", "qwen3-8b", "0", 8371, 0.008, 25000),
                                                               ("nemo12b", "mistral-nemo-instruct-2407", "1", 8373,
                                                                0.010, 18000))
              for i, (suffix, extra) in enumerate((("", {}), ("-api4", {"api_server_count": 4})))),
            *(launch_server(f"b31-{tag}", b31, model, gpu, port, EAGER_LAUNCH, itl, tokens_per_s, **extra)
              for tag, model, gpu, port, itl, tokens_per_s, extra in (
                  ("qwen3-14b", "qwen3-14b", "0", 8381, 0.012, 15000, {}),
                  ("qwen25-7b", "qwen2.5-7b-instruct", "0", 8382, 0.008, 25000, {}),
                  ("qwen3-8b-cg2048", "qwen3-8b", "0", 8383, 0.008, 25000, {"max_cudagraph_capture_size": 2048}),
                  ("llama8b", "llama-3.1-8b", "1", 8384, 0.008, 25000, {}),
                  ("qwen25-15b", "qwen2.5-1.5b", "1", 8385, 0.004, 60000, {}))),
            *(launch_server(f"b32-{tag}", b32, model, gpu, port, points, itl, tokens_per_s, **extra)
              for tag, model, gpu, port, itl, tokens_per_s, points, extra in (
                  ("llama1b", "llama-3.2-1b-instruct", "0", 8391, 0.003, 60000, PIECEWISE_PROMPTS, {}),
                  ("qwen3-8b-cg2048", "qwen3-8b", "0", 8392, 0.008, 25000, PIECEWISE_WIDE,
                   {"max_cudagraph_capture_size": 2048}),
                  ("qwen25-7b", "qwen2.5-7b-instruct", "0", 8393, 0.008, 25000, PIECEWISE_PROMPTS, {}),
                  ("qwen25-15b", "qwen2.5-1.5b", "1", 8394, 0.004, 60000, PIECEWISE_PROMPTS, {}),
                  ("llama8b", "llama-3.1-8b", "1", 8395, 0.008, 25000, PIECEWISE_PROMPTS, {}),
                  # added once the first five had run, the device time left: 36 and 40 layers
                  ("qwen25-3b", "qwen2.5-3b", "1", 8396, 0.005, 40000, PIECEWISE_PROMPTS, {}),
                  ("qwen3-14b", "qwen3-14b", "0", 8397, 0.012, 15000, PIECEWISE_PROMPTS, {}))),
            *frontend_pair("b33-llama8b", b33, "llama-3.1-8b", "0", 8401, 32768, PROMPT_DOOR, 25000, 0.008,
                           step_trace=True),
            *frontend_pair("b33-qwen25-15b", b33, "qwen2.5-1.5b", "1", 8403, 32768, PROMPT_DOOR, 60000, 0.004,
                           step_trace=True, tokenizer_only=True),
            *launch_servers(b34, SHORT_JUDGE, (
                ("qwen25-32b", "qwen2.5-32b-instruct", "0", 8411, 0.020, 6000),
                ("qwen3-32b", "qwen3-32b", "0", 8412, 0.020, 6000),
                ("qwen3moe", "qwen3-30b-a3b", "1", 8413, 0.012, 20000),
                ("dsv2lite", "deepseek-v2-lite", "1", 8414, 0.012, 20000),
            )),
            *launch_servers(b35, WAY_OUT, (
                ("llama8b", "llama-3.1-8b", "0", 8421, 0.008, 25000),
                ("qwen25-32b", "qwen2.5-32b-instruct", "0", 8422, 0.020, 6000),
                ("qwen3moe", "qwen3-30b-a3b", "1", 8423, 0.012, 20000),
                ("qwen3-14b", "qwen3-14b", "1", 8424, 0.012, 15000),
            )),
            *launch_servers(b36, WAY_OUT_AGAIN, (
                ("llama8b", "llama-3.1-8b", "0", 8431, 0.008, 25000),
                ("qwen3-14b", "qwen3-14b", "1", 8432, 0.012, 15000),
            )),
            *(launch_server(f"b37-{tag}{suffix}", b37, model, gpu, port + k, WAVES, itl, tokens_per_s, **extra)
              for tag, model, gpu, port, itl, tokens_per_s in (
                  ("qwen3-8b", "qwen3-8b", "0", 8441, 0.008, 25000),
                  ("qwen25-7b", "qwen2.5-7b-instruct", "1", 8443, 0.008, 25000))
              for k, (suffix, extra) in enumerate((("", {}), ("-api4", {"api_server_count": 4})))),
            *launch_servers(b38, BURST_SIZES, (
                ("llama8b", "llama-3.1-8b", "0", 8451, 0.008, 25000),
                ("qwen3-8b", "qwen3-8b", "1", 8452, 0.008, 25000),
            )),
            *launch_servers(b39, MOE_JUDGE, (
                ("mixtral", "mixtral-8x7b-v0.1", "0", 8461, 0.012, 10000),
                ("qwen3moe", "qwen3-30b-a3b", "1", 8462, 0.012, 20000),
                ("dsv2lite", "deepseek-v2-lite", "1", 8463, 0.012, 20000),
            )),
            *launch_servers(b40, MOE_SHAPES, (
                ("phimoe", "phi-3.5-moe-instruct", "0", 8471, 0.012, 10000),
                ("qwen3moe", "qwen3-30b-a3b", "0", 8472, 0.012, 20000),
                ("glm47flash", "glm-4.7-flash", "1", 8473, 0.012, 15000),
            )),
        ],
    )


if __name__ == "__main__":
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(plan(), indent=1) + "\n")
    p = plan()
    print(f"wrote {OUT.relative_to(ROOT)}: {sum(len(s['points']) for s in p['servers'])} points on "
          f"{len(p['servers'])} servers")
