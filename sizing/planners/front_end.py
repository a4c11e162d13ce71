"""The API servers' way in, simulated: when each request a client sends reaches the engine's queue (docs/formulas.md,
'The API server's event loop').

An API server is one Python process whose event loop runs one piece of work at a time: a new request's reading and
checking (its parse), then, once its prompt is tokenized on the server's tokenizer thread beside the loop, its
hand-over to the engine; and the streaming of every step's tokens to the clients. A request alone on an idle server
takes the three one after another (the handling fitted on requests alone). A request's piece that finds the loop
busy waits until it is free, behind every step's stream that is ready by then: the output handler takes each step's
outputs from the engine and wakes the streams of their requests before the loop comes back to a request's next
piece. So while the loop streams many requests' tokens, new requests get only its idle time, and the replacements a
closed loop sends as its first wave finishes reach the engine late and together (b12's Llama-3.1-8B at 256 in
flight: the engine ended 230 of its first 256 requests over 0.4 s while two replacements reached it). Among
themselves requests' pieces keep the order they became ready in. Where a step's streams take a loop as long as the
step or longer (Llama-3.2-1B at 512 in flight under one API server), the streams alone would keep every request out,
which the real loop does not (it merges a lagging client's tokens and lets requests in between the output handler's
chunks): there every piece runs in the order it became ready. Requests sent together queue their parses ahead of
the first one's hand-over, so a burst's first request reaches the engine once every parse is done, the rest right
after it (batches b28-b36: the first of a burst of 32 prompts of 1,000 tokens reached the engine 59-74 ms later
than a request alone on the dense models; past 32 the wait grows more slowly than that, and by the host: 80-86 ms at
256 on b38's, which the simulation does not hold). A closed loop of fixed lengths keeps its waves so (b12's
Llama-3.1-8B at 64 in flight: none of the 63 replacements sent while its first wave finished reached the engine
before the last of that wave had finished).

A step's tokens that reach a loop whose stream of an earlier step has not begun join it (vLLM's output
collector merges a request's outputs its client has not taken), so a loop behind adds no work for them and streams
more tokens a chunk (b8's Llama-3.2-1B under one API server: 1.6 and 2.3 tokens a chunk at 64 and 128 in flight).
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field

_PARSE, _HAND_OVER, _STREAM = 0, 1, 2
# a piece's rank at the same time: a request's piece that waited for the loop before one that has just become ready
_WAITED, _READY = 0, 1


@dataclass
class FrontEnd:
    """`servers` API server processes: their loops' and tokenizer threads' next free times and the work not yet run."""

    servers: int
    parse_s: float  # a request's first part on the loop: reading and checking it
    hand_over_s: float  # its last part on the loop: its prompt's hand-over to the engine
    tokenize_s_per_token: float  # its prompt on the server's tokenizer thread, per token
    stream_s_per_token: float = 0.0  # the loop's time per token it streams (a server streams its share of each step)
    _loop_free: list[float] = field(init=False)
    _thread_free: list[float] = field(init=False)
    _stream_start: list[float] = field(init=False)
    _stream_done: list[float] = field(init=False)
    _queue: list = field(init=False, default_factory=list)
    _order: itertools.count = field(init=False, default_factory=itertools.count)
    _streamed: tuple[float, float] = field(init=False, default=(-math.inf, 0.0))  # a step's end, its tokens streamed

    def __post_init__(self) -> None:
        self.servers = max(self.servers, 1)
        self._loop_free = [0.0] * self.servers
        self._thread_free = [0.0] * self.servers
        self._stream_start = [-math.inf] * self.servers  # each loop's latest stream: when it begins and ends
        self._stream_done = [0.0] * self.servers
        self._saturated = False  # whether the last step's streams took the loops as long as the step
        self._last_step_end = 0.0

    def send(self, at: float, request: int, prompt_tokens: int, on_last_token: bool = False) -> None:
        """The client sends request `request` (the order it was sent in) at `at`, or (`on_last_token`: a closed
        loop's next) once the loops have streamed the tokens of the step that ended at `at`."""
        heapq.heappush(self._queue, (at, _READY, at, next(self._order), _PARSE, -1,
                                     (request, prompt_tokens, on_last_token, None)))

    def stream(self, at: float, tokens: int) -> None:
        """A step's `tokens` reach the API servers at `at`, an equal share each."""
        if self.stream_s_per_token > 0 and tokens > 0:
            work = tokens * self.stream_s_per_token / self.servers
            # the streams alone keep the loops busy where a step's take as long as the step
            self._saturated = work >= at - self._last_step_end
            self._last_step_end = at
            for s in range(self.servers):
                heapq.heappush(self._queue, (at, _READY, at, next(self._order), _STREAM, s, work))

    def _waits_for_loop(self, server: int, at: float, ready: float, kind: int, s: int, payload) -> bool:
        """Whether a request's piece at `at` finds its loop busy (and the streams leave it idle time): then it runs once
        the loop is free, after every step's stream that is ready by then (the output handler streams a step's tokens
        before the loop takes up a request's next piece), and among requests' pieces in the order they became ready
        (`ready`)."""
        if self._loop_free[server] <= at or self._saturated:
            return False
        heapq.heappush(self._queue, (self._loop_free[server], _WAITED, ready, next(self._order), kind, s, payload))
        return True

    def next_at(self) -> float:
        """When the earliest piece of work not yet run became ready (inf: none)."""
        return self._queue[0][0] if self._queue else math.inf

    def advance(self, until: float) -> list[tuple[float, int, float]]:
        """Run every piece of work that became ready by `until`, in that order: (at the engine, request, sent by the
        client) of each request handed over (a hand-over may end after `until`)."""
        handed = []
        while self._queue and self._queue[0][0] <= until:
            at, _, ready, _, kind, s, payload = heapq.heappop(self._queue)
            if kind == _STREAM:
                if self._stream_start[s] <= at:  # else the tokens join the chunks of a stream not yet begun
                    self._stream_start[s] = max(at, self._loop_free[s])
                    self._loop_free[s] = self._stream_done[s] = self._stream_start[s] + payload
                done = self._stream_done[s]
                self._streamed = (at, max(done, self._streamed[1]) if self._streamed[0] == at else done)
            elif kind == _PARSE:
                request, prompt_tokens, on_last_token, sent = payload
                if on_last_token and self._streamed[0] == at:
                    at = self._streamed[1]
                sent = at if sent is None else sent  # the client's send, however long the loop kept it waiting
                s = min(range(self.servers), key=self._loop_free.__getitem__)
                if self._waits_for_loop(s, at, ready, _PARSE, -1, (request, prompt_tokens, False, sent)):
                    continue
                parsed = max(at, self._loop_free[s]) + self.parse_s
                self._loop_free[s] = parsed
                tokenized = max(parsed, self._thread_free[s]) + prompt_tokens * self.tokenize_s_per_token
                self._thread_free[s] = tokenized
                heapq.heappush(self._queue, (tokenized, _READY, tokenized, next(self._order), _HAND_OVER, s,
                                             (request, sent)))
            else:
                if self._waits_for_loop(s, at, ready, _HAND_OVER, s, payload):
                    continue
                done = max(at, self._loop_free[s]) + self.hand_over_s
                self._loop_free[s] = done
                handed.append((done, *payload))
        return handed
