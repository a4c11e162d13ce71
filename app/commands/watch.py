"""`kvsize watch`: a running vLLM server's /metrics (a URL, or a saved scrape) against the plan."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from sizing.errors import KvsizeError

from app.options import _add_scenario_options, _fraction, _positive_float, _positive_int, scenario_from_args
from app.output import _check_out, _csv_text, _emit

MAX_SCRAPES = 1000


def _interval(text: str) -> float:
    value = _positive_float(text)
    if not 1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"must be between 1 and 3600 seconds, got {text!r}")
    return value


def add_parser(sub) -> None:
    p = sub.add_parser("watch", help="hold a running vLLM server's /metrics against the plan, figure by figure")
    p.add_argument("source", help="the server's metrics URL (http://host:8000/metrics) or a saved /metrics text")
    _add_scenario_options(p, model_required=False)
    p.add_argument("--plan", default=None,
                   help="the JSON of `kvsize plan --out plan.json` or `kvsize estimate --format json`: watch one "
                        "replica of what it deploys (instead of --model, --gpu, --engine, ...)")
    p.add_argument("--kv-cache-dtype", default="auto", help="the KV format the plan chose (default auto)")
    p.add_argument("--hit-rate", type=_fraction, default=None,
                   help="the prefix-cache hit rate the plan's tiers assumed (kvsize tiers), e.g. 0.4")
    p.add_argument("--interval", type=_interval, default=10.0, help="seconds between scrapes of a URL (default 10)")
    p.add_argument("--count", type=_positive_int, default=1,
                   help=f"scrapes of a URL (default 1; at most {MAX_SCRAPES}); counters are read between scrapes")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table", help="output form (default table)")
    p.add_argument("--out", default=None, help="write to this file instead of standard output")
    # unset until run(), so that an option given at its default value is still seen as given beside --plan
    p.set_defaults(run=run, plan_defaults={dest: p.get_default(dest) for dest in PLAN_GIVES})
    p.set_defaults(**dict.fromkeys(PLAN_GIVES))


SCRAPE_SECONDS = 20.0  # a whole scrape, not each read: a server that trickles a byte a second is cut off


class _ScrapeTooSlow(OSError):
    """The scrape's deadline passed while a read was waiting (headers or body)."""


class _DeadlineReader:
    """The raw reads under an HTTP answer, each allowed only the time left before the scrape's deadline: a server
    that trickles its status line, its headers or its body a byte at a time is cut off at the deadline, not after
    a socket timeout per byte."""

    def __init__(self, sock, end: float) -> None:
        import io

        self._sock, self._end, self._files, self._closed = sock, end, 0, False
        outer = self

        class Raw(io.RawIOBase):
            def readable(self) -> bool:
                return True

            def readinto(self, buffer) -> int:
                return outer._sock_read(buffer)

            def close(self) -> None:
                if not self.closed:
                    outer._files -= 1
                    outer._release()
                super().close()

        self.raw = Raw

    def _release(self) -> None:
        # the socket stays open while an answer is read from it (urllib closes the connection's socket before the
        # body is read, as a socket's own makefile allows), and is closed once both are done with it
        if self._closed and self._files == 0:
            self._sock.close()

    def close(self) -> None:
        self._closed = True
        self._release()

    def _sock_read(self, buffer) -> int:
        left = self._end - time.monotonic()
        if left <= 0:
            raise _ScrapeTooSlow("the scrape's deadline passed")
        self._sock.settimeout(left)
        try:
            return self._sock.recv_into(buffer)
        except TimeoutError:
            raise _ScrapeTooSlow("the scrape's deadline passed") from None

    def makefile(self, mode: str = "rb", *args, **kwargs):
        import io

        if "r" not in mode or "w" in mode:
            return self._sock.makefile(mode, *args, **kwargs)
        self._files += 1
        return io.BufferedReader(self.raw())

    def __getattr__(self, name):
        return getattr(self._sock, name)


def _deadline_opener(end: float):
    """A urllib opener whose connections read under the scrape's deadline (redirects and HTTPS as urlopen)."""
    import http.client
    import urllib.request

    def bounded(base):
        class Connection(base):
            def connect(self) -> None:
                given = self.timeout if isinstance(self.timeout, (int, float)) else 10.0
                self.timeout = max(0.001, min(given, end - time.monotonic()))
                super().connect()
                self.sock = _DeadlineReader(self.sock, end)

        return Connection

    http_class, https_class = bounded(http.client.HTTPConnection), bounded(http.client.HTTPSConnection)

    class Http(urllib.request.HTTPHandler):
        def http_open(self, req):
            return self.do_open(http_class, req)

    class Https(urllib.request.HTTPSHandler):
        def https_open(self, req):
            return self.do_open(https_class, req, context=self._context)

    return urllib.request.build_opener(Http, Https)


def _http_scrape(source: str, limit: int, deadline_s: float = SCRAPE_SECONDS) -> bytes:
    """One GET of a /metrics URL, bounded in bytes and in time as a whole (every read of the status line, the
    headers and the body waits only for what is left of `deadline_s`); every way it can fail (a malformed URL or
    port, a bad status line or headers, a cut or short body, a slow server) is one line naming the URL."""
    import http.client
    import urllib.error

    from sizing.errors import escaped

    shown_url = escaped(source[:120]) + ("…" if len(source) > 120 else "")
    if any(c.isspace() or ord(c) < 32 for c in source):
        raise KvsizeError(f"--source '{shown_url}': a URL holds no spaces or control characters")
    end = time.monotonic() + deadline_s
    too_slow = KvsizeError(f"{shown_url}: the scrape took over {deadline_s:g} s; a /metrics answer is far faster "
                           "(is this the server's metrics URL?)")
    chunks, size = [], 0
    try:
        with _deadline_opener(end).open(source, timeout=min(10.0, deadline_s)) as response:
            length = response.headers.get("Content-Length")
            while True:
                if time.monotonic() > end:
                    raise too_slow
                chunk = response.read1(65536) if hasattr(response, "read1") else response.read(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if size > limit:
                    raise KvsizeError(f"{shown_url} sent more than {limit:,} bytes; a /metrics scrape is far smaller")
    except KvsizeError:
        raise
    except _ScrapeTooSlow:
        raise too_slow from None
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, _ScrapeTooSlow) or (isinstance(reason, TimeoutError) and time.monotonic() >= end):
            raise too_slow from None
        raise KvsizeError(f"cannot read {shown_url}: {escaped(str(reason)[:160]) or type(e).__name__}") from None
    data = b"".join(chunks)
    if length is not None and length.isdigit() and len(length) <= 20 and len(data) < int(length):
        raise KvsizeError(f"{shown_url}: the answer ended after {len(data):,} of its {int(length):,} bytes; "
                          "a cut scrape is not judged")
    return data


def _scrape(source: str) -> str:
    from sizing.inputs import read_limited
    from sizing.evidence.metrics import MAX_METRICS_BYTES

    if source.startswith(("http://", "https://")):
        data = _http_scrape(source, MAX_METRICS_BYTES)
    else:
        data = read_limited(Path(source), MAX_METRICS_BYTES, "SOURCE", "a saved /metrics text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise KvsizeError(f"{source} is not UTF-8 text; expected a /metrics scrape") from None


def _with_server_settings(scenario, metrics, args):
    """The plan takes what the server's own vllm:cache_config_info says where the command line leaves it to
    the default: the KV dtype, gpu_memory_utilization and block size the engine runs with (said on stderr)."""
    from dataclasses import replace

    from sizing.evidence.metrics import MODEL_PRECISION

    taken = {}
    if args.kv_cache_dtype == "auto" and metrics.cache_dtype and metrics.cache_dtype not in MODEL_PRECISION:
        taken.update(k_cache_dtype=metrics.cache_dtype, v_cache_dtype=metrics.cache_dtype)
    if scenario.memory_fraction is None and scenario.kv_cache_memory_bytes is None \
            and metrics.gpu_memory_utilization is not None and scenario.engine.startswith("vllm"):
        taken["memory_fraction"] = metrics.gpu_memory_utilization
    if scenario.block_size is None and metrics.block_size is not None and scenario.engine.startswith("vllm"):
        taken["block_size"] = metrics.block_size
    if taken:
        print("kvsize: note: the plan takes " + ", ".join(f"{k}={v}" for k, v in taken.items() if k != "v_cache_dtype")
              + " from the server's vllm:cache_config_info (give them on the command line to plan otherwise)",
              file=sys.stderr)
    return replace(scenario, **taken) if taken else scenario


# the options a --plan file gives; naming them too would leave two answers to one question
PLAN_GIVES = {"model": "--model", "gpu": "--gpu", "engine": "--engine", "tensor_parallel_size": "--tensor-parallel-size",
              "max_model_len": "--max-model-len", "kv_cache_dtype": "--kv-cache-dtype", "concurrency": "--concurrency",
              "block_size": "--block-size", "hit_rate": "--hit-rate"}


def _plan_file(args: argparse.Namespace):
    """The --plan file's deployment (sizing/planners/deployment.py); the options it gives may not be given too."""
    from sizing.planners.deployment import MAX_PLAN_BYTES, read_deployment
    from sizing.inputs import read_limited

    both = [flag for dest, flag in PLAN_GIVES.items() if getattr(args, dest) is not None]
    if both:
        raise KvsizeError(f"--plan gives the deployment; drop {', '.join(both)} (or drop --plan and give them all)")
    data = read_limited(Path(args.plan), MAX_PLAN_BYTES, "--plan", "a plan's or an estimate's JSON")
    return read_deployment(data, f"--plan {args.plan}")


def run(args: argparse.Namespace) -> int:
    from sizing.evidence.metrics import PlannedPool, read_metrics, watch
    from sizing.capacity.estimate import estimate

    if args.count > MAX_SCRAPES:
        raise KvsizeError(f"--count {args.count}: at most {MAX_SCRAPES} scrapes")
    if args.count > 1 and not args.source.startswith(("http://", "https://")):
        raise KvsizeError("--count above 1 needs a URL: a saved text does not change between scrapes")
    deployment = _plan_file(args) if args.plan is not None else None
    if deployment is None:
        if args.model is None:
            raise KvsizeError("--model is required (or --plan with the JSON a plan or an estimate wrote)")
        for dest, default in args.plan_defaults.items():
            if getattr(args, dest) is None:
                setattr(args, dest, default)
        scenario = scenario_from_args(args, args.model, args.gpu, args.engine, args.tensor_parallel_size,
                                      args.max_model_len, args.kv_cache_dtype, args.kv_cache_dtype)
    if args.out is not None:
        _check_out(Path(args.out))
    rows, previous, outside, pool = [], None, False, None
    if deployment is not None:
        pool, concurrency, hit_rate = deployment.pool(), deployment.concurrency, deployment.hit_rate
        label = (f"{deployment.engine}, planned for {deployment.model} on {deployment.gpu}"
                 f"{f' TP {deployment.tensor_parallel_size}' if deployment.tensor_parallel_size > 1 else ''}")
    else:
        concurrency, hit_rate = scenario.concurrency, args.hit_rate
    for n in range(args.count):
        if n:
            time.sleep(args.interval)
        metrics = read_metrics(_scrape(args.source))
        if pool is None:
            e = estimate(_with_server_settings(scenario, metrics, args))
            pool, label = PlannedPool.of(e), e.engine.label
        for line in watch(metrics, pool, concurrency, hit_rate, previous):
            rows.append({"scrape": n + 1, **asdict(line)})
            outside |= line.inside is False
        previous = metrics
    if args.format == "json":
        _emit(json.dumps({"source": args.source, "plan": {"num_blocks": pool.num_blocks, "block_size": pool.block_size,
                                                          "kv_format": pool.kv_format, "concurrency": concurrency,
                                                          "max_model_len": pool.max_model_len},
                          "figures": rows}, indent=2) + "\n", args.out, "json")
    elif args.format == "csv":
        _emit(_csv_text(rows), args.out, "csv")
    else:
        lines = [f"{args.source} against the plan ({label}; {pool.num_blocks:,} blocks of {pool.block_size} tokens, "
                 f"{concurrency} requests at {pool.max_model_len:,} tokens)"]
        for r in rows:
            mark = {True: "inside the plan", False: "OUTSIDE the plan", None: "no planned figure"}[r["inside"]]
            lines.append(f"  [{r['scrape']}] {r['figure']:<22} {r['engine']:<34} planned {r['planned']:<40} {mark}")
            if r["inside"] is False:
                lines.append(f"      → {r['advice']}")
        _emit("\n".join(lines) + "\n", args.out)
    if outside:
        print("kvsize: the deployment is outside the plan on at least one figure (see above)", file=sys.stderr)
        return 1
    return 0
