"""Per-step timing from inside vLLM's engine core, for the serving runs (issue 48).

`vllm bench serve` times each request from the client; it cannot say how long each engine step took or what was in
it. The open loops near saturation need that split: the server's median gap between tokens there is 30-40% above
the simulation's, and only the steps themselves tell a longer mixed prefill-and-decode step from time the engine
core spends idle or on the host.

This module is a vLLM general plugin (entry point group `vllm.general_plugins`, loaded by vLLM in every process,
the engine core included). Where `KVSIZE_STEP_TRACE_DIR` is set, it wraps the engine core's scheduler once the
scheduler is built, and appends one line per call to `steps-<pid>.tsv` in that folder:

    S  t_start  t_end  ctx_reqs  ctx_tokens  gen_reqs  running  waiting
    U  t_start  t_end  outputs

`S` is a `schedule()` call: the prompt chunks it scheduled (requests and tokens), the requests it scheduled for
one token each, and the scheduler's running and waiting counts after it. `U` is an `update_from_output()` call,
made once the step's tokens are back from the GPU. Times are the host's wall clock (`time.time()`, seconds), the
clock the load generator stamps its requests with. Under async scheduling the next step is scheduled before the
last one's update, so the reader pairs them in order rather than by position.

Nothing here imports vLLM at import time, and nothing is patched where the variable is unset: the plugin is inert
on every server that does not ask for it. `install_dir()` writes the folder a server's PYTHONPATH takes to find it.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

ENV_DIR = "KVSIZE_STEP_TRACE_DIR"
DIST_NAME = "kvsize_step_trace"
FLUSH_EVERY_S = 0.5


class StepLog:
    """Buffered lines of one engine core process, flushed at most every FLUSH_EVERY_S: a server stopped with
    SIGTERM loses at most that much of its tail."""

    def __init__(self, path: Path):
        self._file = open(path, "a", buffering=1 << 16)
        self._lock = threading.Lock()
        self._flushed = time.time()

    def write(self, line: str, now: float) -> None:
        with self._lock:
            self._file.write(line)
            if now - self._flushed >= FLUSH_EVERY_S:
                self._file.flush()
                self._flushed = now


def scheduled_split(num_scheduled_tokens: dict) -> tuple[int, int, int]:
    """(prompt-chunk requests, prompt-chunk tokens, one-token requests) of one step's scheduled tokens by request.
    Without speculative decoding a decoding request is scheduled one token a step, so a request given more than one
    is in its prompt. (A prompt whose last chunk is a single token is counted as decoding; looking each request up
    in the scheduler's table would tell it apart, at a cost per request that would lengthen the steps it times.)"""
    ctx_reqs = ctx_tokens = 0
    for n in num_scheduled_tokens.values():
        if n > 1:
            ctx_reqs += 1
            ctx_tokens += n
    return ctx_reqs, ctx_tokens, len(num_scheduled_tokens) - ctx_reqs


def trace_scheduler(scheduler, log: StepLog) -> None:
    """Wrap one scheduler instance's schedule() and update_from_output() (on the instance, so that any scheduler
    class and its subclasses are timed once)."""
    schedule, update = scheduler.schedule, scheduler.update_from_output

    def timed_schedule(*args, **kwargs):
        t0 = time.time()
        out = schedule(*args, **kwargs)
        t1 = time.time()
        ctx_reqs, ctx_tokens, gen_reqs = scheduled_split(out.num_scheduled_tokens)
        running = len(getattr(scheduler, "running", ()))
        waiting = len(getattr(scheduler, "waiting", ()))
        log.write(f"S\t{t0:.6f}\t{t1:.6f}\t{ctx_reqs}\t{ctx_tokens}\t{gen_reqs}\t{running}\t{waiting}\n", t1)
        return out

    def timed_update(*args, **kwargs):
        t0 = time.time()
        out = update(*args, **kwargs)
        t1 = time.time()
        outputs = sum(len(getattr(o, "outputs", ())) for o in out.values()) if isinstance(out, dict) else 0
        log.write(f"U\t{t0:.6f}\t{t1:.6f}\t{outputs}\n", t1)
        return out

    scheduler.schedule, scheduler.update_from_output = timed_schedule, timed_update


def register() -> None:
    """The plugin's entry point: called by vLLM in each of its processes."""
    folder = os.environ.get(ENV_DIR)
    if not folder:
        return
    try:
        from vllm.v1.core.sched.scheduler import Scheduler
    except ImportError:
        return
    if getattr(Scheduler, "_kvsize_step_trace", False):
        return
    built = Scheduler.__init__

    # vLLM loads general plugins at the top of the engine core's constructor, before it builds its scheduler, so
    # the scheduler's constructor (which every scheduler class runs through super()) is the first place to hook
    def traced_init(self, *args, **kwargs):
        built(self, *args, **kwargs)
        Path(folder).mkdir(parents=True, exist_ok=True)
        trace_scheduler(self, StepLog(Path(folder) / f"steps-{os.getpid()}.tsv"))

    Scheduler.__init__ = traced_init
    Scheduler._kvsize_step_trace = True


def install_dir(folder: Path) -> Path:
    """Write this module and a distribution record naming it as a vLLM general plugin into `folder`, for a
    server's PYTHONPATH (importlib.metadata finds entry points in any folder on the path). Returns `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kvsize_step_trace.py").write_text(Path(__file__).read_text())
    info = folder / f"{DIST_NAME}-1.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST_NAME}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[vllm.general_plugins]\nkvsize_step_trace = kvsize_step_trace:register\n")
    return folder
