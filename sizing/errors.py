"""One error type for every bad input, so front ends can print one line and exit 2."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

# What a config, a log, a scrape or a URL could carry to a terminal or a page: C0 and C1 controls (an escape
# sequence recolours or rewrites the screen; a line break would end the one line), the bidirectional overrides
# and isolates that show text in another order than it is written, line and paragraph separators, and lone
# surrogates (which no encoding writes). Tabs pass where a stream allows them (`keep`).
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
MAX_MESSAGE_CHARS = 1200
_LONG_QUOTED = re.compile(r"'([^'\n]{200,})'")  # a value quoted whole, hundreds of characters long


def escaped(text: str, keep: str = "") -> str:
    """`text` with every unsafe character written as its escape (\\x1b, \\u202e), those in `keep` left as they are."""
    def escape(m: re.Match) -> str:
        c = m.group()
        if c in keep:
            return c
        if c in _NAMED:
            return _NAMED[c]
        return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"

    return UNSAFE.sub(escape, text)


def shown(value: object, limit: int = 80) -> str:
    """A value from the input as an error quotes it: escaped, cut to `limit` characters (saying how long it
    was), and quoted when it is text."""
    raw = value if isinstance(value, str) else str(value)
    text = escaped(raw[:limit + 1])
    if len(raw) > limit:
        text = f"{text[:limit]}… ({len(raw):,} characters)"
    return f"'{text}'" if isinstance(value, str) else text


class KvsizeError(ValueError):
    """A problem with the user's input or plan, phrased for the user: always one line, with what it quotes from
    the input escaped (line breaks, terminal escapes, bidirectional overrides) and a message longer than
    MAX_MESSAGE_CHARS cut in its middle, so that both what was wrong and what to change stay in it."""

    def __init__(self, message: object = "", *args: object) -> None:
        text = str(message)
        if len(text) > 100 * MAX_MESSAGE_CHARS:  # only its ends are shown: escape no more than those
            text = text[:50 * MAX_MESSAGE_CHARS] + text[-50 * MAX_MESSAGE_CHARS:]
        # a value quoted whole from the input ('...' of hundreds of characters) is cut to its start and its length
        text = _LONG_QUOTED.sub(lambda m: shown(m.group(1), 80), escaped(text))
        if len(text) > MAX_MESSAGE_CHARS:
            keep = MAX_MESSAGE_CHARS // 2
            text = f"{text[:keep]} … ({len(text) - 2 * keep:,} characters left out) … {text[-keep:]}"
        super().__init__(text, *args)


def unknown(kind: str, name: str, choices: Iterable[str], option: str | None = None) -> KvsizeError:
    """An error for an unknown name that lists the closest known names."""
    choices = sorted(choices)
    lowered = [c.lower() for c in choices]
    # names the typed one is part of first (int4 -> int4_per_token_head, lmdeploy_int4), then look-alikes
    typed = name.lower().strip()[:200]
    holding = [c for c in lowered if typed and typed in c and c != typed]
    holding.sort(key=lambda c: (not c.startswith(typed), len(c)))
    close = list(dict.fromkeys([*holding, *difflib.get_close_matches(typed, lowered, n=4, cutoff=0.4)]))[:4]
    by_lower = {c.lower(): c for c in choices}
    hint = f"; did you mean {', '.join(by_lower[c] for c in close)}?" if close else ""
    where = f" ({option})" if option else ""
    listing = ", ".join(choices) if len(choices) <= 12 else ", ".join(choices[:12]) + ", …"
    return KvsizeError(f"unknown {kind} {shown(name)}{where}{hint} Known: {listing}")
